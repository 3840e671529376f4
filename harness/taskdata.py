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


class TaskDataError(RuntimeError):
    """A task's documents cannot be found where the user said they are."""


def read_records(path: str | Path) -> list[dict]:
    """The records of a JSON-lines or CSV file."""
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"task data {path} is missing")
    if path.suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle))
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def split_of(records: list[dict], split: str):
    """A ``DatasetDict`` with one split (no cache, no hub).

    Every decodebench task reports infini-gram agreement, so its reference index is opened here,
    when the task loads its documents: a damaged index stops the run before any generation.
    """
    from datasets import Dataset, DatasetDict

    from decodebench.metrics.generation import open_reference

    open_reference()
    return DatasetDict({split: Dataset.from_list(records)})


def bundled_split(path: str | Path, split: str = "test"):
    """A bundled sample as a one-split ``DatasetDict``."""
    return split_of(read_records(path), split)


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
        return read_records(local_path(benchmark, data_dir))
    return hub_records(benchmark)
