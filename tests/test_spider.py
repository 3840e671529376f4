"""Spider execution accuracy: the official test-suite semantics, and harmless predictions."""

from __future__ import annotations

import sqlite3
import time

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
    assert extract_sql("no sql here") == ""


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


def test_a_missing_database_or_broken_gold_query_is_an_error_not_a_zero(db, tmp_path):
    with pytest.raises(SpiderError, match="does not exist"):
        score("SELECT 1", "SELECT 1", tmp_path / "missing.sqlite")
    with pytest.raises(SpiderError, match="gold query fails"):
        score("SELECT 1", "SELECT nothing FROM nowhere", db)
