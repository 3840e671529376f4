"""Spider tasks: schema-in-prompt text-to-SQL scored by execution accuracy.

``spider`` loads Spider's dev split from the Hugging Face hub; its sqlite databases are not on
the hub, so it needs ``--metadata '{"spider_db_dir": "/path/to/spider/database"}'`` (the
``database/`` folder of spider.zip from https://yale-lily.github.io/spider). Where a database
folder holds several ``.sqlite`` files (the test-suite distribution), a prediction must match on
all of them. ``spider_mini`` builds its two databases from the SQL scripts in ``mini/``.
"""

import hashlib
import os
import sqlite3
import tempfile
from pathlib import Path

from decodebench.metrics import spider_execution_accuracy
from decodebench.metrics.generation import generation_metrics
from decodebench.metrics.spider import SpiderError
from decodebench.paths import home
from decodebench.taskdata import load_jsonl

MINI = Path(__file__).with_name("mini")


def schema(db_path: str) -> str:
    """The database's CREATE statements, as Spider prompts usually show them."""
    conn = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL").fetchall()
    finally:
        conn.close()
    return "\n".join(row[0].strip() + ";" for row in rows)


def database_files(db_dir: Path, db_id: str) -> list[str]:
    folder = db_dir / db_id
    main = folder / f"{db_id}.sqlite"
    if not main.is_file():
        raise SpiderError(f"the Spider database for db_id '{db_id}' is missing: expected {main}")
    return [str(main), *sorted(str(p) for p in folder.glob("*.sqlite") if p != main)]


def _with_databases(records, db_dir: Path):
    from datasets import Dataset, DatasetDict

    rows = []
    for record in records:
        files = database_files(db_dir, record["db_id"])
        rows.append(
            {
                "db_id": record["db_id"],
                "question": record["question"],
                "query": record["query"],
                "db_paths": files,
                "schema": schema(files[0]),
            }
        )
    return DatasetDict({"validation": Dataset.from_list(rows)})


def build_mini_databases() -> Path:
    """Build the mini databases once from their SQL scripts (rebuilt if a script changes)."""
    scripts = sorted(MINI.glob("*.sql"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in scripts)).hexdigest()[:12]
    root = home() / "spider_mini" / digest
    for script in scripts:
        target = root / script.stem / f"{script.stem}.sqlite"
        if target.is_file():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=f".{script.stem}.", suffix=".partial", dir=target.parent)
        os.close(fd)
        try:
            conn = sqlite3.connect(partial)
            conn.executescript(script.read_text())
            conn.commit()
            conn.close()
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return root


def load_mini(**kwargs):
    return _with_databases(load_jsonl(MINI / "spider_mini.jsonl"), build_mini_databases())


def load_spider(spider_db_dir=None, **kwargs):
    if not spider_db_dir:
        raise SpiderError(
            "the spider task needs Spider's databases, which are not on the Hugging Face hub: download spider.zip "
            "from https://yale-lily.github.io/spider and pass --metadata "
            '\'{"spider_db_dir": "/path/to/spider/database"}\''
        )
    from datasets import load_dataset

    dev = load_dataset("xlangai/spider", split="validation")
    return _with_databases(dev, Path(spider_db_dir))


def process_results(doc, results):
    prediction = results[0]
    accuracy = min(spider_execution_accuracy(prediction, doc["query"], path) for path in doc["db_paths"])
    return {"execution_accuracy": accuracy, **generation_metrics(prediction)}
