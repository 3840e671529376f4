"""Spider execution accuracy, with the official test-suite evaluation's comparison semantics.

``spider_execution_accuracy(prediction, gold_sql, db_path)`` takes the SQL out of a generation,
runs it and the gold query on the sqlite database, and returns 1.0 when their results are the
same (taoyds/test-suite-sql-eval, ``exec_eval.result_eq``; reference/anchors.md section 7):

- both results empty: equal; different numbers of rows or columns: not equal;
- columns may come in any order: a permutation of the predicted columns must reproduce the gold
  result (only permutations whose column value multisets match are tried);
- rows compare as multisets, or as lists when the gold query has ``ORDER BY``;
- ``DISTINCT`` is removed from both queries before running them (the suite's default;
  ``keep_distinct=True`` keeps it).

Unlike the suite, a runaway query is really stopped (a progress handler aborts it after
``timeout_s``; the suite's asyncio timeout cannot interrupt sqlite), and the prediction runs on a
connection that can only read: the database is opened read-only and an authorizer denies every
operation but reading, so a prediction can never change, attach or create anything.

A prediction that is empty, not SQL, malformed, refused or too slow scores 0. A missing database
or a gold query that fails raises ``SpiderError``: that is a broken task, not a wrong answer.
"""

from __future__ import annotations

import itertools
import re
import sqlite3
import time
from collections import Counter
from pathlib import Path

import sqlparse

# Operations a query may perform; everything else (writes, ATTACH, PRAGMA, ...) is denied.
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_FENCE = re.compile(r"```(?:sql|sqlite)?\s*\n?(.*?)```", re.DOTALL | re.IGNORECASE)
_START = re.compile(r"\b(select|with)\b", re.IGNORECASE)
_PROSE = re.compile(r"^(this|the|here|explanation|note|it|which|where the|in this)\b", re.IGNORECASE)
MAX_ROWS = 100_000


class SpiderError(RuntimeError):
    """The task is broken (missing database, failing gold query), not the prediction."""


class QueryRefused(RuntimeError):
    """The prediction could not be run: not SQL, not allowed, too slow or failing."""


def extract_sql(generation: str) -> str:
    """The first SQL statement of a generation: inside a code fence if there is one, else from the
    first SELECT/WITH to a semicolon, a blank line, or a line that reads as prose."""
    fenced = _FENCE.search(generation)
    text = fenced.group(1) if fenced else generation
    start = _START.search(text)
    if start is None:
        return ""
    text = text[start.start() :]
    lines = []
    for line in text.splitlines():
        if not line.strip() or (lines and _PROSE.match(line.strip())):
            break
        lines.append(line)
    statements = [s for s in sqlparse.split("\n".join(lines)) if s.strip()]
    return statements[0].strip().rstrip(";").strip() if statements else ""


def remove_distinct(sql: str) -> str:
    """Drop the DISTINCT keyword (not inside strings), as the test-suite evaluation does by default."""
    tokens = sqlparse.parse(sql)[0].flatten() if sql.strip() else []
    return "".join(token.value for token in tokens if token.value.lower() != "distinct")


def _open(db_path: str | Path) -> sqlite3.Connection:
    path = Path(db_path)
    if not path.is_file():
        raise SpiderError(f"Spider database {path} does not exist")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    conn.set_authorizer(lambda action, *args: sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY)
    conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
    return conn


def run_query(conn: sqlite3.Connection, sql: str, timeout_s: float) -> list[tuple]:
    """Rows of one read-only statement, or QueryRefused (timeout, error, not allowed)."""
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        cursor = conn.execute(sql)
        rows = cursor.fetchmany(MAX_ROWS + 1)
    except sqlite3.Error as exc:
        reason = "timed out" if time.monotonic() > deadline else str(exc)
        raise QueryRefused(reason) from exc
    except (ValueError, OverflowError) as exc:  # e.g. several statements, or values Python cannot hold
        raise QueryRefused(str(exc)) from exc
    finally:
        conn.set_progress_handler(None, 0)
    if len(rows) > MAX_ROWS:
        raise QueryRefused(f"more than {MAX_ROWS} rows")
    return rows


def results_equal(gold: list[tuple], pred: list[tuple], order_matters: bool) -> bool:
    """The test-suite's ``result_eq``: same rows up to a column permutation (and order, if asked)."""
    if not gold and not pred:
        return True
    if len(gold) != len(pred):
        return False
    width = len(gold[0])
    if any(len(row) != width for row in pred):
        return False
    # quick rejection: the rows' value multisets must match whatever the column order
    if Counter(tuple(sorted(map(repr, row))) for row in gold) != Counter(tuple(sorted(map(repr, row))) for row in pred):
        return False
    gold_columns = [Counter(row[i] for row in gold) for i in range(width)]
    pred_columns = [Counter(row[i] for row in pred) for i in range(width)]
    candidates = [[j for j in range(width) if pred_columns[j] == gold_columns[i]] for i in range(width)]
    for permutation in itertools.product(*candidates):
        if len(set(permutation)) != width:
            continue
        permuted = [tuple(row[j] for j in permutation) for row in pred]
        if permuted == gold if order_matters else Counter(permuted) == Counter(gold):
            return True
    return False


def spider_execution_accuracy(
    prediction: str, gold_sql: str, db_path: str | Path, timeout_s: float = 10.0, keep_distinct: bool = False
) -> float:
    """1.0 when the prediction's SQL returns the gold query's result on ``db_path``, else 0.0."""
    conn = _open(db_path)
    try:
        gold_query = gold_sql if keep_distinct else remove_distinct(gold_sql)
        try:
            gold = run_query(conn, gold_query, timeout_s)
        except QueryRefused as exc:
            raise SpiderError(f"the gold query fails on {db_path}: {exc}: {gold_sql}") from exc
        sql = extract_sql(prediction)
        if not sql:
            return 0.0
        try:
            pred = run_query(conn, sql if keep_distinct else remove_distinct(sql), timeout_s)
        except QueryRefused:
            return 0.0
        return float(results_equal(gold, pred, order_matters="order by" in gold_sql.lower()))
    finally:
        conn.close()
