"""Loading bundled task data so that it resolves wherever ``lm_eval`` is run from.

lm-eval resolves relative ``data_files`` against the working directory, so bundled tasks use
``custom_dataset: !function utils.load`` and build their split from a path next to the YAML.
"""

from __future__ import annotations

import json
from pathlib import Path


def load_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"bundled task data {path} is missing; reinstall decodebench")
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def bundled_split(path: str | Path, split: str = "test"):
    """A ``DatasetDict`` with one split built from a bundled jsonl file (no cache, no hub)."""
    from datasets import Dataset, DatasetDict

    return DatasetDict({split: Dataset.from_list(load_jsonl(path))})
