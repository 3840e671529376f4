"""Spider execution accuracy, with the official test-suite evaluation's semantics.

``spider_execution_accuracy(prediction, gold_sql, db_path)`` takes the SQL out of a generation,
runs it and the gold query on the sqlite database, and returns 1.0 when their results are the
same, as taoyds/test-suite-sql-eval's ``exec_eval.eval_exec_match`` decides with its defaults
(``plug_value=False``, ``keep_distinct=False``; reference/anchors.md section 7):

- its post-processing first: spaced operators ``> =``, ``< =``, ``! =`` are closed up, and
  ``DISTINCT`` is removed from both queries (``keep_distinct=True`` keeps it);
- both results empty: equal; different numbers of rows or columns: not equal;
- values compare as values, so ``3 == 3.0`` (a ``count(*)`` computed as a real number matches);
- columns may come in any order: some assignment of predicted columns to gold columns must
  reproduce the gold result;
- rows compare as multisets, or as lists when the gold query has ``ORDER BY``.

The official scorer takes bare SQL; a generation is text, so ``extract_sql`` takes the first
SQL statement out of it: inside the first code fence that holds SQL, else from the start of the
text when it starts with SQL, else after prose that ends a line or a colon ("Here is the query:
SELECT ..."). A generation that starts with something that is not SQL and has no SQL at a line
start ("SELEC name FROM ... INTERSECT SELECT ...") has none, and a first statement that is not a
query (``DELETE FROM singer; SELECT ...``) scores 0, as the official verdicts do.

Every prediction is bounded end to end, not only inside SQLite: its text length, the length of
any string or blob SQLite may build (``SQLITE_LIMIT_LENGTH``, 100 KB: ``zeroblob(1e9)`` fails at
once; Spider's values are at most a few hundred bytes) and of a LIKE or GLOB pattern
(``SQLITE_LIMIT_LIKE_PATTERN_LENGTH``, 1,000), SQLite's page cache (sorts and temporary tables go
to disk), the rows and bytes of its result, and the wall time of its execution and of the column
matching. SQLite checks for an interrupt only between its virtual machine's steps, so one function
call (a LIKE, an ``instr``) runs to its end whatever the deadline: the limits bound what one call
can cost (a LIKE of a 100 KB string against a 1,000-character pattern, an ``instr`` of 100 KB in
100 KB: well under a second here), and a progress handler and a watchdog thread that interrupts
the connection stop the query at its deadline between calls (the test-suite's asyncio timeout
cannot interrupt SQLite). The prediction runs on a
read-only connection whose authorizer denies everything but reading. Whatever the text, a
prediction scores 0 or 1 and never raises; a missing database or a gold query that fails
raises ``SpiderError``: that is a broken task, not a wrong answer.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

# Operations a query may perform; everything else (writes, ATTACH, PRAGMA, ...) is denied.
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
MAX_PREDICTION_CHARS = 100_000  # longer generations are not a query
MAX_VALUE_BYTES = 100_000  # SQLITE_LIMIT_LENGTH: the longest string or blob SQLite may build
MAX_LIKE_PATTERN = 1_000  # SQLITE_LIMIT_LIKE_PATTERN_LENGTH (SQLite's default: 50,000)
CACHE_KIB = 16 * 1024  # SQLite's page cache per connection
MAX_ROWS = 100_000
MAX_RESULT_BYTES = 64 * 2**20

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)
# SQL that starts a statement: SELECT, or WITH [RECURSIVE] name [(columns)] AS (
_SQL_START = re.compile(r"(?:SELECT\b|WITH\s+(?:RECURSIVE\s+)?[\w\"`\[\]]+\s*(?:\([^()]*\))?\s*AS\s*\()", re.I)
# Any statement keyword: a generation that starts with one starts with SQL (a DELETE is not prose).
_STATEMENT = re.compile(
    r"(?:SELECT|WITH|VALUES|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|ATTACH|DETACH|PRAGMA|VACUUM|EXPLAIN"
    r"|BEGIN|COMMIT|ROLLBACK|ANALYZE|REINDEX)\b",
    re.I,
)
# SQL after prose: at the start of a line, or after a colon.
_AFTER_PROSE = re.compile(r"(?:^|\n|:)[ \t]*(?=SELECT\b|WITH\b)", re.I)
# Words that start an English sentence and never an SQL line.
_PROSE_STARTS = {
    "this", "the", "here", "it", "its", "note", "explanation", "these", "those", "that", "i", "we", "you",
    "output", "result", "results", "answer", "query", "a", "an", "please", "hope", "let", "there", "which",
}  # fmt: skip
_OPERATOR_SPACES = (("> =", ">="), ("< =", "<="), ("! =", "!="))


class SpiderError(RuntimeError):
    """The task is broken (missing database, failing gold query), not the prediction."""


class QueryRefused(RuntimeError):
    """The prediction could not be run: not SQL, not allowed, too slow, too large or failing."""


# -- finding the SQL in a generation -------------------------------------------------------
def extract_sql(generation: str) -> str:
    """The first SQL statement of a generation ('' when it holds none)."""
    if len(generation) > MAX_PREDICTION_CHARS:
        return ""
    for language, body in _FENCE.findall(generation):
        if language.lower() in ("", "sql", "sqlite") and _starts_with_sql(body):
            return first_statement(body.strip())
    text = generation.strip()
    if _STATEMENT.match(text):  # it starts with SQL: its first statement, whatever it is
        return first_statement(text)
    found = next((m.end() for m in _AFTER_PROSE.finditer(text) if _SQL_START.match(text, m.end())), None)
    return first_statement(text[found:]) if found is not None else ""


def _starts_with_sql(text: str) -> bool:
    return bool(_STATEMENT.match(text.strip()))


def first_statement(text: str) -> str:
    """Up to the first ``;`` outside strings and comments, and before any prose that follows.

    A blank line ends the statement only when the one so far is complete (balanced parentheses,
    and a ``WITH`` that already has its main query), so common table expressions written with
    blank lines between them are kept whole.
    """
    lines, depth, blanks = [], 0, 0
    for code, ends in _code_lines(text):
        stripped = code.strip()
        if not stripped:
            blanks += bool(lines)
            continue
        if lines and _is_prose(stripped):
            break
        if blanks and depth == 0 and not _open_with("\n".join(lines)):
            break
        lines += [""] * blanks + [code]
        blanks = 0
        depth += _paren_balance(code)
        if ends:
            break
    return "\n".join(lines).strip().rstrip(";").strip()


def _code_lines(text: str):
    """(line text up to a top-level ``;``, whether the statement ended there) for each line."""
    quote, block_comment, start = None, False, 0
    i = 0
    while i < len(text):
        char = text[i]
        if block_comment:
            if text.startswith("*/", i):
                block_comment, i = False, i + 1
        elif quote:
            if char == quote:
                quote = None
        elif char in "'\"`":
            quote = char
        elif char == "[":
            quote = "]"
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = len(text) - 1 if end < 0 else end - 1
        elif text.startswith("/*", i):
            block_comment, i = True, i + 1
        elif char == ";":
            yield text[start:i], True
            return
        elif char == "\n":
            yield text[start:i], False
            start = i + 1
        i += 1
    yield text[start:], False


def _is_prose(line: str) -> bool:
    """A sentence: a prose word, then more words ("RESULT, x" and "a.name" are SQL)."""
    tokens = re.findall(r"[A-Za-z']+|\S", line)
    words = [t for t in tokens if t[0].isalpha()]
    return (
        len(words) >= 3
        and tokens[0].lower() in _PROSE_STARTS
        and tokens[1][0].isalpha()
        and not any(c in line for c in "=()*")
    )


def _paren_balance(code: str) -> int:
    code = re.sub(r"'[^']*'|\"[^\"]*\"", "", code)
    return code.count("(") - code.count(")")


def _open_with(statement: str) -> bool:
    """A WITH statement whose main query has not started yet (its CTE list goes on)."""
    if not re.match(r"\s*WITH\b", statement, re.I):
        return False
    depth = 0
    for token in re.finditer(r"\(|\)|\bSELECT\b", re.sub(r"'[^']*'", "", statement), re.I):
        text = token.group(0)
        depth += 1 if text == "(" else -1 if text == ")" else 0
        if text.upper() == "SELECT" and depth == 0:
            return False
    return True


# -- the official post-processing ----------------------------------------------------------
def postprocess(sql: str) -> str:
    """The test-suite's post-processing: ``> =`` becomes ``>=`` (and ``< =``, ``! =``)."""
    for spaced, closed in _OPERATOR_SPACES:
        sql = sql.replace(spaced, closed)
    return sql


def remove_distinct(sql: str) -> str:
    """Drop the word DISTINCT outside strings, identifiers in quotes and comments (the suite's default)."""
    out, i = [], 0
    pattern = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?\*/|\bdistinct\b", re.I | re.S)
    for match in pattern.finditer(sql):
        out.append(sql[i : match.start()])
        if match.group(0).lower() != "distinct":
            out.append(match.group(0))
        i = match.end()
    out.append(sql[i:])
    return "".join(out)


# -- running queries within bounds -----------------------------------------------------------
def _open(db_path: str | Path) -> sqlite3.Connection:
    path = Path(db_path)
    if not path.is_file():
        raise SpiderError(f"Spider database {path} does not exist")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_PREDICTION_CHARS)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN)
    # a small page cache, and sorts and temporary tables on disk: SQLite's memory stays bounded
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    conn.execute("PRAGMA temp_store=FILE")
    conn.set_authorizer(lambda action, *args: sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY)
    conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
    return conn


class Watchdog:
    """One thread that interrupts each watched connection at its deadline: it also stops work between steps that
    runs no opcodes, where the progress handler is not called. (A timer thread per query cost more than most
    Spider queries: starting a thread waits until the scheduler has run it, milliseconds on a busy machine.)"""

    def __init__(self):
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked child has the state but not the thread

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._deadlines: dict[int, tuple[float, sqlite3.Connection]] = {}
        self._thread: threading.Thread | None = None
        self._wakes_at = float("inf")  # when the thread looks next, unless woken
        self._next_key = 0

    @contextmanager
    def watching(self, conn: sqlite3.Connection, deadline: float):
        with self._changed:
            key = self._next_key = self._next_key + 1
            self._deadlines[key] = (deadline, conn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._interrupt_at_deadlines, name="spider-query-deadlines")
                self._thread.daemon = True
                self._thread.start()
            if deadline < self._wakes_at:
                self._changed.notify()
        try:
            yield
        finally:
            with self._changed:  # no interrupt reaches this connection's next statement
                self._deadlines.pop(key, None)

    def _interrupt_at_deadlines(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for key, (deadline, conn) in list(self._deadlines.items()):
                    if deadline <= now:
                        conn.interrupt()
                        del self._deadlines[key]
                self._wakes_at = min((deadline for deadline, _ in self._deadlines.values()), default=float("inf"))
                self._changed.wait(None if self._wakes_at == float("inf") else self._wakes_at - now)


_WATCHDOG = Watchdog()


def run_query(conn: sqlite3.Connection, sql: str, timeout_s: float) -> list[tuple]:
    """Rows of one read-only statement, or QueryRefused (timeout, error, not allowed, too large)."""
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    rows, size = [], 0
    try:
        with _WATCHDOG.watching(conn, deadline):
            cursor = conn.execute(sql)
            while batch := cursor.fetchmany(1000):
                rows += batch
                size += sum(_value_bytes(v) for row in batch for v in row)
                if len(rows) > MAX_ROWS or size > MAX_RESULT_BYTES:
                    raise QueryRefused(f"more than {MAX_ROWS} rows or {MAX_RESULT_BYTES} bytes")
    except sqlite3.Error as exc:
        raise QueryRefused("timed out" if time.monotonic() > deadline else str(exc)) from exc
    except (ValueError, OverflowError, MemoryError) as exc:  # several statements, values Python cannot hold
        raise QueryRefused(str(exc)) from exc
    finally:
        conn.set_progress_handler(None, 0)
    return rows


def _value_bytes(value) -> int:
    return len(value) if isinstance(value, (str, bytes)) else 8


# -- comparing results -------------------------------------------------------------------------
def results_equal(gold: list[tuple], pred: list[tuple], order_matters: bool, deadline: float = float("inf")) -> bool:
    """The test-suite's ``result_eq``: the same rows up to a column assignment (and order, if asked)."""
    if not gold and not pred:
        return True
    if len(gold) != len(pred):
        return False
    width = len(gold[0])
    if any(len(row) != width for row in pred):
        return False
    # quick rejection, as the suite does: each row's values as a sorted bag, rows as a set (or list)
    if not _same_unordered_rows(gold, pred, order_matters):
        return False
    gold_columns = [Counter(row[i] for row in gold) for i in range(width)]
    pred_vectors = [tuple(row[j] for row in pred) for j in range(width)]
    candidates = [[j for j in range(width) if Counter(pred_vectors[j]) == gold_columns[i]] for i in range(width)]
    target = gold if order_matters else Counter(gold)

    def assign(i: int, used: set[int], chosen: list[int]) -> bool:
        if time.monotonic() > deadline:
            raise QueryRefused("comparing the results took too long")
        if i == width:
            permuted = [tuple(row[j] for j in chosen) for row in pred]
            return (permuted if order_matters else Counter(permuted)) == target
        tried = set()
        for j in candidates[i]:
            # identical predicted columns are interchangeable: try one of each kind
            if j in used or pred_vectors[j] in tried:
                continue
            tried.add(pred_vectors[j])
            if assign(i + 1, used | {j}, [*chosen, j]):
                return True
        return False

    return assign(0, set(), [])


def _same_unordered_rows(gold, pred, order_matters: bool) -> bool:
    def unordered(row):
        # the suite's key, string and type name concatenated: with it, the rows (10, 1001) and
        # (10.0, 1001) sort differently and are rejected, as the official verdicts have them
        return tuple(sorted(row, key=lambda value: str(value) + str(type(value))))

    g, p = [unordered(row) for row in gold], [unordered(row) for row in pred]
    return g == p if order_matters else set(g) == set(p)


def _gold(conn: sqlite3.Connection, gold_sql: str, db_path, timeout_s: float, keep_distinct: bool):
    """(the gold query as the suite runs it, its rows), or SpiderError naming the database and the query."""
    gold_query = postprocess(gold_sql)
    gold_query = gold_query if keep_distinct else remove_distinct(gold_query)
    try:
        return gold_query, run_query(conn, gold_query, timeout_s)
    except QueryRefused as exc:
        raise SpiderError(f"the gold query fails on {db_path}: {exc}: {gold_sql}") from exc


def check_gold_query(gold_sql: str, db_path: str | Path, timeout_s: float = 10.0) -> None:
    """Run a document's gold query as scoring will, so that broken task data stops a run at load, not after
    all generation: a missing, empty or corrupt database, or a gold query that fails, raises SpiderError."""
    try:
        conn = _open(db_path)
    except sqlite3.DatabaseError as exc:
        raise SpiderError(f"the Spider database {db_path} cannot be opened: {exc}") from exc
    try:
        _gold(conn, gold_sql, db_path, timeout_s, keep_distinct=False)
    finally:
        conn.close()


def spider_execution_accuracy(
    prediction: str, gold_sql: str, db_path: str | Path, timeout_s: float = 10.0, keep_distinct: bool = False
) -> float:
    """1.0 when the prediction's SQL returns the gold query's result on ``db_path``, else 0.0."""
    conn = _open(db_path)
    try:
        gold_query, gold = _gold(conn, gold_sql, db_path, timeout_s, keep_distinct)
        sql = postprocess(extract_sql(prediction))
        if not sql:
            return 0.0
        started = time.monotonic()
        try:
            pred = run_query(conn, sql if keep_distinct else remove_distinct(sql), timeout_s)
            order_matters = "order by" in gold_query.lower()
            return float(results_equal(gold, pred, order_matters, deadline=started + timeout_s))
        except (QueryRefused, RecursionError):
            return 0.0
    finally:
        conn.close()
