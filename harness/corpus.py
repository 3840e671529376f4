"""Plain-text corpora: the one reader for everything that reads one (``decodebench build-index``,
``decodebench train-nugget``), and the default corpus that needs no download.

A corpus is a ``.jsonl`` file (one JSON object per line, its text in a ``text`` field, or
``article`` as CNN/DailyMail writes it), a ``.txt`` file (one document per blank-line-separated
paragraph), or a folder of them (read in sorted order). A malformed file stops the reader with
its name, the line, and what a line must hold.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

TEXT_FIELDS = ("text", "article")  # the fields a .jsonl record may keep its text in, in order of preference
REFERENCE_CORPUS = "Python's reference documentation (pydoc_data.topics, PSF license)"


class CorpusError(ValueError):
    """A corpus that is missing, empty, or not in one of the formats above."""


def corpus_files(path: Path) -> list[Path]:
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"corpus {path}: no such file or folder")
    files = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".txt")) if path.is_dir() else [path]
    if not files:
        raise CorpusError(f"corpus {path}: no .jsonl or .txt files in this folder")
    return files


def read_corpus(path: Path) -> Iterator[str]:
    """The documents of a corpus, one string each, in file order."""
    found = False
    for file in corpus_files(path):
        for document in _read_file(file):
            found = True
            yield document
    if not found:
        raise CorpusError(f"corpus {path}: no documents")


def _read_file(file: Path) -> Iterator[str]:
    try:
        if file.suffix != ".jsonl":
            yield from (p for p in file.read_text(encoding="utf-8").split("\n\n") if p.strip())
            return
        with open(file, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    yield _text_of(line, f"{file}:{number}")
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _text_of(line: str, where: str) -> str:
    expected = f"expected a JSON object with a {' or '.join(repr(f) for f in TEXT_FIELDS)} string field"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{where}: not valid JSON ({exc.msg}); {expected}") from exc
    text = next((record[f] for f in TEXT_FIELDS if f in record), None) if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise CorpusError(f"{where}: {expected}")
    return text


def reference_corpus() -> list[str]:
    """Python's reference documentation: English prose that shares no text with the benchmarks, shipped with
    every CPython (the default corpus of the reference infini-gram index and of train-nugget)."""
    import pydoc_data.topics

    return [text for _, text in sorted(pydoc_data.topics.topics.items())]
