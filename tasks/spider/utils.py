"""Spider tasks: schema-in-prompt text-to-SQL scored by execution accuracy.

``spider`` evaluates Spider dev. Its sqlite databases are not on the hub: they come from a local
copy, ``--metadata '{"data_dir": DIR}'`` with ``DIR/spider/database/<db_id>/<db_id>.sqlite`` (the
``database/`` folder of spider.zip from https://yale-lily.github.io/spider), and the questions from
``DIR/spider/validation.jsonl`` when it is there, else from the hub. Where a database folder holds
several ``.sqlite`` files (the test-suite distribution), a prediction must match on all of them.
``spider_mini`` reads its sample and the real databases it needs from this folder.
"""

import sqlite3
from pathlib import Path

from decodebench.data.taskdata import FIELDS, LOCAL_FILES, SPIDER_DATABASES, benchmark_records, read_records, split_of
from decodebench.metrics import spider_execution_accuracy
from decodebench.metrics.generation import generation_metrics
from decodebench.metrics.spider import SpiderError, check_gold_query

HERE = Path(__file__).parent


def schema(db_path: str) -> str:
    """The database's CREATE statements, as Spider prompts usually show them."""
    conn = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL").fetchall()
    except sqlite3.DatabaseError as exc:
        raise SpiderError(f"the Spider database {db_path} cannot be read: {exc}") from exc
    finally:
        conn.close()
    if not rows:
        raise SpiderError(f"the Spider database {db_path} has no tables (an empty or truncated file?)")
    return "\n".join(row[0].strip() + ";" for row in rows)


def database_files(db_dir: Path, db_id: str) -> list[str]:
    folder = db_dir / db_id
    main = folder / f"{db_id}.sqlite"
    if not main.is_file():
        raise SpiderError(f"the Spider database for db_id '{db_id}' is missing: expected {main}")
    return [str(main), *sorted(str(p) for p in folder.glob("*.sqlite") if p != main)]


def _with_databases(records, db_dir: Path):
    """Each question with its databases and schema; every gold query is run on each of its databases here, as
    scoring will run it, so that broken data stops the run before any generation."""
    rows = []
    for record in records:
        files = database_files(db_dir, record["db_id"])
        prompt_schema = schema(files[0])  # first: an empty file is named as such, not by its missing tables
        for file in files:
            check_gold_query(record["query"], file)
        rows.append(
            {
                "db_id": record["db_id"],
                "question": record["question"],
                "query": record["query"],
                "db_paths": files,
                "schema": prompt_schema,
            }
        )
    return split_of(rows, "validation")


def load_mini(**kwargs):
    return _with_databases(read_records(HERE / "spider_mini.jsonl", FIELDS["spider"]), HERE / "database")


def load(data_dir=None, **kwargs):
    if not data_dir or not (Path(data_dir).expanduser() / SPIDER_DATABASES).is_dir():
        raise SpiderError(
            "the spider task needs Spider's databases, which are not on the Hugging Face hub: download spider.zip "
            f"from https://yale-lily.github.io/spider and pass --metadata '{{\"data_dir\": DIR}}' with its database "
            f"folder at DIR/{SPIDER_DATABASES} (and, without the hub, the questions at DIR/{LOCAL_FILES['spider']})"
        )

    local = (Path(data_dir).expanduser() / LOCAL_FILES["spider"]).is_file()
    records = benchmark_records("spider", data_dir if local else None)
    return _with_databases(records, Path(data_dir).expanduser() / SPIDER_DATABASES)


def process_results(doc, results):
    prediction = results[0]
    accuracy = min(spider_execution_accuracy(prediction, doc["query"], path) for path in doc["db_paths"])
    return {"execution_accuracy": accuracy, **generation_metrics(prediction)}
