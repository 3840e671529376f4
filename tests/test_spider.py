"""Spider execution accuracy: the official test-suite semantics, and harmless predictions."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from decodebench.metrics import SpiderError, extract_sql, spider_execution_accuracy


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "shop.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL);
        INSERT INTO products VALUES (1, 'Desk', 'furniture', 250), (2, 'Chair', 'furniture', 90),
            (3, 'Lamp', 'lighting', 35.5), (4, 'Bulb', 'lighting', 4.5), (5, 'Sofa', 'furniture', 90);
        CREATE TABLE numbers (n INTEGER);
        WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < 2000)
        INSERT INTO numbers SELECT n FROM seq;
    """)
    conn.commit()
    conn.close()
    return path


def score(prediction, gold, db, **kwargs):
    return spider_execution_accuracy(prediction, gold, db, **kwargs)


def test_equivalent_queries_written_differently_score_one(db):
    gold = "SELECT name FROM products WHERE price > 50"
    assert score("SELECT p.name FROM products AS p WHERE NOT p.price <= 50", gold, db) == 1.0
    assert score("select name from products where price between 50.01 and 1000", gold, db) == 1.0
    gold = "SELECT count(*) FROM products WHERE category = 'lighting'"
    assert score("SELECT sum(category = 'lighting') FROM products", gold, db) == 1.0


def test_row_order_matters_only_when_the_gold_query_orders(db):
    unordered_gold = "SELECT name FROM products WHERE category = 'furniture'"
    assert score("SELECT name FROM products WHERE category = 'furniture' ORDER BY name DESC", unordered_gold, db) == 1
    ordered_gold = "SELECT name FROM products ORDER BY price"
    assert score("SELECT name FROM products ORDER BY price DESC", ordered_gold, db) == 0.0
    assert score("SELECT name FROM products ORDER BY price ASC", ordered_gold, db) == 1.0


def test_rows_compare_as_multisets(db):
    gold = "SELECT price FROM products WHERE category = 'furniture'"  # 250, 90, 90
    assert score("SELECT price FROM products WHERE price >= 90", gold, db) == 1.0
    assert score("SELECT price FROM products WHERE price IN (90, 250) GROUP BY price", gold, db) == 0.0


def test_distinct_is_removed_as_the_official_evaluation_does(db):
    gold = "SELECT DISTINCT category FROM products"
    assert score("SELECT category FROM products", gold, db) == 1.0
    assert score("SELECT category FROM products", gold, db, keep_distinct=True) == 0.0


def test_column_order_does_not_matter_but_columns_do(db):
    gold = "SELECT name, price FROM products WHERE category = 'lighting'"
    assert score("SELECT price, name FROM products WHERE category = 'lighting'", gold, db) == 1.0
    assert score("SELECT name FROM products WHERE category = 'lighting'", gold, db) == 0.0
    assert score("SELECT name, price, id FROM products WHERE category = 'lighting'", gold, db) == 0.0


def test_wrong_empty_malformed_and_non_sql_predictions_score_zero(db):
    gold = "SELECT name FROM products WHERE price > 50"
    assert score("SELECT name FROM products WHERE price > 100", gold, db) == 0.0
    assert score("", gold, db) == 0.0
    assert score("I do not know the answer.", gold, db) == 0.0
    assert score("SELECT name FROM products WHERE", gold, db) == 0.0
    assert score("SELECT nme FROM products", gold, db) == 0.0
    assert score("SELECT name FROM nowhere", gold, db) == 0.0


def test_sql_is_taken_out_of_fences_and_prose():
    assert extract_sql("Here you go:\n```sql\nSELECT a\nFROM t;\n```\nThis returns a.") == "SELECT a\nFROM t"
    assert extract_sql("SELECT a FROM t;\nThis query selects a.") == "SELECT a FROM t"
    assert (
        extract_sql("The query is: SELECT a FROM t WHERE b = 'x; y'\n\nIt works.") == "SELECT a FROM t WHERE b = 'x; y'"
    )
    assert extract_sql("SELECT a FROM t\nThis returns all rows") == "SELECT a FROM t"
    assert extract_sql("WITH x AS (SELECT 1) SELECT * FROM x") == "WITH x AS (SELECT 1) SELECT * FROM x"
    assert extract_sql("Here is the query with a count: SELECT count(*) FROM t") == "SELECT count(*) FROM t"
    assert extract_sql("no sql here") == ""


def test_the_first_statement_is_the_prediction_and_text_that_does_not_start_with_sql_has_none():
    # a mistyped keyword is not prose: the official scorer runs it, fails, and scores 0
    assert extract_sql("SELEC name FROM a INTERSECT SELECT name FROM b") == ""
    # a leading DELETE is the first statement: not a query, so it scores 0 (below), never the SELECT after it
    assert extract_sql("DELETE FROM singer; SELECT count(*) FROM singer") == "DELETE FROM singer"
    assert extract_sql("SELECT 1; SELECT 2") == "SELECT 1"
    assert extract_sql("SELECT a FROM t -- the names; all of them\nWHERE b = 1") == (
        "SELECT a FROM t -- the names; all of them\nWHERE b = 1"
    )
    assert extract_sql("SELECT name,\n       RESULT,\n       x\nFROM battle") == (
        "SELECT name,\n       RESULT,\n       x\nFROM battle"
    )


def test_ctes_with_blank_lines_and_several_fences():
    cte = "WITH a AS (\n  SELECT 1 AS x\n),\n\nb AS (\n  SELECT 2 AS x\n)\n\nSELECT * FROM a UNION SELECT * FROM b"
    assert extract_sql(cte) == cte
    assert extract_sql(f"```sql\n{cte}\n```") == cte
    assert extract_sql("SELECT 1\n\nSELECT 2") == "SELECT 1"  # a second query after a blank line is not kept
    fences = (
        "First the table:\n```\nname | age\n```\nThen the query:\n```sql\nSELECT age FROM t\n```\n```sql\nSELECT 2\n```"
    )
    assert extract_sql(fences) == "SELECT age FROM t"


def test_values_compare_as_the_official_scorer_does(db):
    assert score("SELECT count(*) + 0.0 FROM products", "SELECT count(*) FROM products", db) == 1.0  # 5 == 5.0
    gold = "SELECT name FROM products WHERE price  >=  90"
    assert score("SELECT name FROM products WHERE price > = 90", gold, db) == 1.0  # spaced operators, closed up
    assert score("DELETE FROM products; SELECT count(*) FROM products", "SELECT count(*) FROM products", db) == 0.0


# Each case must cost at most 2 s and 256 MB beyond a trivial prediction, and score 0.
BOUNDED = {
    "a 1 GB zeroblob": "SELECT zeroblob(1e9)",
    "a 900 MB randomblob": "SELECT length(randomblob(9e8))",
    "a 1 MB select list": "SELECT " + ", ".join(["price"] * 150_000) + " FROM products",
    "10,000 nested parentheses": "SELECT " + "(" * 10_000 + "1" + ")" * 10_000,
    "a 100 MB string from a recursive query": "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r "
    "WHERE length(s) < 1e8) SELECT max(length(s)) FROM r",
    "a million-row cross join": "SELECT a.n, b.n FROM numbers a, numbers b",
}
MEASURE = """
import resource, sys, time
from decodebench.metrics import spider_execution_accuracy
prediction = open(sys.argv[1]).read()
start = time.monotonic()
score = spider_execution_accuracy(prediction, "SELECT count(*) FROM products", sys.argv[2], timeout_s=1.5)
print(score, time.monotonic() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _measure(prediction: str, db, tmp_path) -> tuple[float, float, float]:
    file = tmp_path / "prediction.txt"
    file.write_text(prediction)
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(file), str(db)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    value, seconds, max_rss_kib = proc.stdout.split()
    return float(value), float(seconds), int(max_rss_kib) / 1024


@pytest.mark.parametrize("case", list(BOUNDED))
def test_every_prediction_is_bounded_in_time_and_memory_and_scores_zero(case, db, tmp_path):
    _, _, base_mb = _measure("SELECT 1", db, tmp_path)
    value, seconds, peak_mb = _measure(BOUNDED[case], db, tmp_path)
    assert value == 0.0
    assert seconds <= 2.0, f"{case}: {seconds:.1f} s"
    assert peak_mb - base_mb <= 256, f"{case}: {peak_mb - base_mb:.0f} MB more than a trivial prediction"


def test_any_text_scores_zero_or_one_and_never_raises(db):
    for text in [
        "",
        ";",
        "```",
        "```sql\n```",
        "SELECT",
        "SELECT '",
        "WITH",
        "(" * 50_000,
        "\x00SELECT 1",
        "SELECT 1;" * 10**5,
    ]:
        assert score(text, "SELECT count(*) FROM products", db) in (0.0, 1.0)


OFFICIAL = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_execution_accuracy_agrees_with_the_official_verdicts_on_every_fixture_prediction():
    """The test-suite evaluation's verdicts on 5,812 predictions over 400 real dev questions."""
    verdicts = OFFICIAL / "official" / "spider_exec_official.jsonl"
    if not verdicts.is_file():
        pytest.skip(f"the official verdicts are not at {verdicts}")
    rows = [json.loads(line) for line in verdicts.read_text().splitlines()]
    disagreements = []
    for row in rows:
        database = OFFICIAL / "spider" / "database" / row["db_id"] / f"{row['db_id']}.sqlite"
        if spider_execution_accuracy(row["prediction"], row["gold"], database) != row["official_exec_match"]:
            disagreements.append((row["kind"], row["official_exec_match"], row["prediction"]))
    assert len(rows) == 5812
    assert disagreements == [], f"{len(disagreements)} disagreements: {disagreements[:10]}"


@pytest.mark.parametrize(
    "harmful",
    [
        "DROP TABLE products",
        "DELETE FROM products",
        "UPDATE products SET price = 0",
        "INSERT INTO products VALUES (9, 'x', 'y', 1)",
        "CREATE TABLE evil (x)",
        "ATTACH DATABASE 'created_by_prediction.sqlite' AS evil",
        "VACUUM INTO 'created_by_prediction.sqlite'",
        "PRAGMA writable_schema = ON",
        "SELECT 1; DROP TABLE products",
        "SELECT load_extension('/tmp/x')",
    ],
)
def test_harmful_sql_does_no_harm(db, harmful, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = db.read_bytes()
    assert score(harmful, "SELECT count(*) FROM products", db) == 0.0
    assert db.read_bytes() == before
    assert not (tmp_path / "created_by_prediction.sqlite").exists()
    assert score("SELECT count(*) FROM products", "SELECT count(*) FROM products", db) == 1.0


def test_an_endless_query_is_stopped(db):
    endless = "SELECT count(*) FROM numbers a, numbers b, numbers c, numbers d"  # 1.6e13 rows
    start = time.monotonic()
    assert score(endless, "SELECT count(*) FROM numbers", db, timeout_s=0.5) == 0.0
    assert time.monotonic() - start < 30  # generous: only checks that the query did not run to the end


# One function call runs to its end whatever SQLite's interrupts: these took 60 s and, row by row, 95 s for 40 rows
LONG_CALLS = {
    "a 49,000-character LIKE pattern": "SELECT count(*) FROM singer WHERE printf('%.999000c','a') LIKE '%' || "
    "printf('%.49000c','a') || 'b'",
    "a long LIKE pattern on every row": "SELECT count(*) FROM singer WHERE printf('%.999000c', name) LIKE '%' || "
    "printf('%.990c', name) || 'b'",
    "a GLOB on every row": "SELECT count(*) FROM singer WHERE printf('%.99000c', name) GLOB '*' || "
    "printf('%.990c', name) || 'b'",
    "an instr of 49 KB in 99 KB on every row": "SELECT count(*) FROM singer WHERE instr(printf('%.99000c', name), "
    "printf('%.49000c', name) || 'b')",
}


@pytest.mark.parametrize("case", list(LONG_CALLS))
def test_a_prediction_made_of_long_single_calls_is_bounded_by_its_time_budget(case, tmp_path):
    """A budget of 2 s, not the official 10 s: the GLOB case runs until the budget ends, and the bound is the same
    code whatever the budget (it ends at 2.1 s here, 10.1 s at 10 s)."""
    path = tmp_path / "concert.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE singer (name TEXT)")
    conn.executemany("INSERT INTO singer VALUES (?)", [(f"singer {i}",) for i in range(40)])
    conn.commit()
    conn.close()
    start = time.monotonic()
    assert score(LONG_CALLS[case], "SELECT count(*) FROM singer", path, timeout_s=2.0) == 0.0
    assert time.monotonic() - start < 7  # the budget, and the one call that runs to its end after it


def test_a_missing_database_or_broken_gold_query_is_an_error_not_a_zero(db, tmp_path):
    with pytest.raises(SpiderError, match="does not exist"):
        score("SELECT 1", "SELECT 1", tmp_path / "missing.sqlite")
    with pytest.raises(SpiderError, match="gold query fails"):
        score("SELECT 1", "SELECT nothing FROM nowhere", db)
