"""Where decodebench's tasks get their documents: the bundled real samples, or the full benchmarks
from a local copy or from the Hugging Face hub.

- The ``*_mini`` tasks read samples bundled next to their YAML (tasks/<task>/DATA.md says what each
  is); lm-eval resolves relative ``data_files`` against the working directory, so they use
  ``custom_dataset: !function utils.load_mini`` and build their split from a path next to the YAML.
- The full tasks (squad, spider, cnndm, aime, gpqa) load from the hub, or, on a machine without
  it, from a local copy in the hub's schema, given with lm-eval's own ``--metadata``::

      lm_eval --tasks squad,spider,cnndm --metadata '{"data_dir": "/data/benchmarks"}' ...

  ``data_dir`` holds one file per benchmark, at the paths of ``LOCAL_FILES`` (the layout of
  decodebench's data pack), and Spider's databases under ``spider/database/<db_id>/``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

DATA_DIR = "data_dir"  # the --metadata key
# benchmark -> its file under data_dir, in the hub's schema (JSON lines, or CSV for GPQA)
LOCAL_FILES = {
    "squad": "squad/validation.jsonl",
    "spider": "spider/validation.jsonl",
    "cnndm": "cnndm/test.jsonl",
    "aime": "aime/aime_1983_2024/train.jsonl",
    "gpqa": "gpqa/gpqa_diamond.csv",
}
SPIDER_DATABASES = "spider/database"
# benchmark -> (hub dataset, configuration, split) where users with the hub get it
HUB_DATASETS = {
    "squad": ("rajpurkar/squad", None, "validation"),
    "spider": ("xlangai/spider", None, "validation"),
    "cnndm": ("abisee/cnn_dailymail", "3.0.0", "test"),
    "aime": ("gneubig/aime-1983-2024", None, "train"),
    "gpqa": ("Idavidrein/gpqa", "gpqa_diamond", "train"),
}
GATED = ("gated", "401", "403", "authenticat", "access")
# benchmark -> the fields each of its records needs (the hub's schema), checked when a file is read
FIELDS = {
    "squad": ("context", "question", "answers.text"),  # a dotted name: a field inside a field
    "spider": ("db_id", "question", "query"),
    "cnndm": ("article", "highlights"),
    "aime": ("Question", "Answer"),
    "gpqa": ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"),
}


class TaskDataError(RuntimeError):
    """A task's documents cannot be found where the user said they are."""


def read_records(path: str | Path, fields: tuple[str, ...] = ()) -> list[dict]:
    """The records of a JSON-lines or CSV file, each an object with ``fields``; anything else is a TaskDataError
    that names the file, the line, and what a record must hold."""
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"task data {path} is missing")
    expected = f"each record must be an object with the fields {', '.join(map(repr, fields))}" if fields else ""
    try:
        if path.suffix == ".csv":
            with open(path, encoding="utf-8", newline="") as handle:
                reader = csv.DictReader(handle)
                missing = [f for f in fields if f not in (reader.fieldnames or [])]
                if missing:
                    raise TaskDataError(f"{path}: no column(s) {', '.join(map(repr, missing))}; {expected}")
                records = [(number, row) for number, row in enumerate(reader, 2)]
        else:
            with open(path, encoding="utf-8") as handle:
                lines = [(number, _json_record(line, path, number, expected)) for number, line in enumerate(handle, 1)]
            records = [(number, record) for number, record in lines if record is not None]
    except UnicodeDecodeError as exc:
        raise TaskDataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not records:
        raise TaskDataError(f"{path}: no records" + (f"; {expected}" if expected else ""))
    for number, record in records:
        missing = [f for f in fields if _field(record, f) in (None, "", [])]
        if missing:
            raise TaskDataError(f"{path}:{number}: the record has no {', '.join(map(repr, missing))}; {expected}")
    return [record for _, record in records]


def _field(record: dict, name: str):
    for part in name.split("."):
        record = record.get(part) if isinstance(record, dict) else None
    return record


def _json_record(line: str, path: Path, number: int, expected: str) -> dict | None:
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TaskDataError(f"{path}:{number}: not valid JSON ({exc.msg}, a cut line?); {expected}") from None
    if not isinstance(record, dict):
        raise TaskDataError(f"{path}:{number}: a JSON {type(record).__name__} where an object is expected; {expected}")
    return record


def split_of(records: list[dict], split: str):
    """A ``DatasetDict`` with one split (no cache, no hub).

    Every decodebench task reports infini-gram agreement, so its reference index is opened here,
    when the task loads its documents: a damaged index stops the run before any generation.
    """
    from datasets import Dataset, DatasetDict

    from decodebench.metrics.generation import open_reference

    open_reference()
    return DatasetDict({split: Dataset.from_list(records)})


def bundled_split(path: str | Path, benchmark: str, split: str = "test"):
    """A bundled sample of ``benchmark`` as a one-split ``DatasetDict``."""
    return split_of(read_records(path, FIELDS[benchmark]), split)


def local_path(benchmark: str, data_dir: str | Path) -> Path:
    path = Path(data_dir).expanduser() / LOCAL_FILES[benchmark]
    if not path.is_file():
        layout = "; ".join(f"{name}: {file}" for name, file in LOCAL_FILES.items())
        raise TaskDataError(
            f"--metadata data_dir={data_dir}: {path} does not exist. A local copy holds, in the hub's schema: "
            f"{layout} (and Spider's databases under {SPIDER_DATABASES}/<db_id>/)"
        )
    return path


def hub_records(benchmark: str) -> list[dict]:
    """The benchmark's records from the Hugging Face hub, or a one-line error that says what to do without it."""
    from datasets import load_dataset

    dataset, configuration, split = HUB_DATASETS[benchmark]
    try:
        return list(load_dataset(dataset, configuration, split=split))
    except ConnectionError as exc:
        raise TaskDataError(
            f"task {benchmark}: its documents come from the Hugging Face hub ({dataset}), which cannot be reached "
            f"({exc}). Without the hub, give a local copy in the hub's schema with --metadata "
            f"'{{\"data_dir\": DIR}}' (DIR/{LOCAL_FILES[benchmark]}), or run the bundled sample: "
            f"--tasks {benchmark}_mini (all five: --tasks decodebench_mini)"
        ) from None
    except Exception as exc:
        if any(word in str(exc).lower() for word in GATED):
            raise TaskDataError(
                f"task {benchmark}: {dataset} is a gated dataset: accept its terms on "
                f"https://huggingface.co/datasets/{dataset}, then log in with `hf auth login` or set HF_TOKEN ({exc})"
            ) from exc
        raise


def benchmark_records(benchmark: str, data_dir: str | Path | None) -> list[dict]:
    """The benchmark's records: from ``data_dir`` when given, else from the hub."""
    if data_dir:
        return read_records(local_path(benchmark, data_dir), FIELDS[benchmark])
    return hub_records(benchmark)
