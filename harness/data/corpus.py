"""Plain-text corpora: the one reader for everything that reads one (``decodebench build-index``,
``decodebench train-nugget``), and the default corpus that needs no download.

A corpus is a ``.jsonl`` file (one JSON object per line, its text in a ``text`` field, or
``article`` as CNN/DailyMail writes it), a ``.txt`` file (one document per blank-line-separated
paragraph), a dictd database (its ``.index`` file, beside its ``.dict.dz`` or ``.dict``: one document
per entry), or a folder of them (read in sorted order). A malformed file stops the reader with
its name, the line, and what a line must hold.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path

TEXT_FIELDS = ("text", "article")  # the fields a .jsonl record may keep its text in, in order of preference
SUFFIXES = (".jsonl", ".txt", ".index")
REFERENCE_CORPUS = "Python's reference documentation (pydoc_data.topics, PSF license)"
# train-nugget's default: English prose on every subject computing touches, from three of Debian's dictd packages,
# which no task evaluates on (the paper trains on general web text, which cannot be downloaded here)
PROSE_DICTIONARIES = {  # index file: (what it is, its license, the Debian package)
    "/usr/share/dictd/foldoc.index": ("FOLDOC, the Free On-line Dictionary of Computing", "GFDL 1.1+", "dict-foldoc"),
    "/usr/share/dictd/jargon.index": ("the Jargon File 4.4.7", "public domain", "dict-jargon"),
    "/usr/share/dictd/devil.index": ("Ambrose Bierce's The Devil's Dictionary", "public domain", "dict-devil"),
}
PROSE_CORPUS = "; ".join(f"{what} ({license}; {package})" for what, license, package in PROSE_DICTIONARIES.values())


class CorpusError(ValueError):
    """A corpus that is missing, empty, or not in one of the formats above."""


def corpus_files(path: Path) -> list[Path]:
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"corpus {path}: no such file or folder")
    files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES) if path.is_dir() else [path]
    if not files:
        raise CorpusError(f"corpus {path}: no .jsonl, .txt or dictd .index files in this folder")
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
        if file.suffix == ".index":
            yield from _read_dictd(file)
            return
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


_DICTD_DIGITS = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _dictd_number(text: str, where: str) -> int:
    try:
        value = 0
        for digit in text:
            value = value * 64 + _DICTD_DIGITS[digit]
        return value
    except KeyError:
        raise CorpusError(f"{where}: {text!r} is not a dictd base-64 offset or length") from None


def _read_dictd(index: Path) -> Iterator[str]:
    """A dictd database's entries in index order, each once (several headwords may point at one entry), as plain
    prose: its cross-reference braces dropped and each paragraph on one line (dictd wraps at 72 columns, a layout
    a model would learn to imitate). Headwords that start with ``00`` are the database's own description."""
    for text, _ in read_dictd_terms(index):
        yield text


# stand-ins for a cross-reference's braces while an entry's whitespace is normalized (Unicode private use: no
# dictionary writes them)
_OPEN, _CLOSE = "\ue000", "\ue001"


def read_dictd_terms(index: Path) -> Iterator[tuple[str, list[tuple[int, int]]]]:
    """``_read_dictd``'s entries, each with the character spans of its cross-references: the terms its authors
    marked ``{like this}`` as having entries of their own (FOLDOC, the Jargon File), the dictionary's own mark of
    what a reader would look up (``decodebench train-nugget --recipe answer-spans`` learns from them)."""
    data_file = next((p for p in (index.with_suffix(".dict.dz"), index.with_suffix(".dict")) if p.is_file()), None)
    if data_file is None:
        raise CorpusError(f"{index}: a dictd index needs its {index.stem}.dict.dz or {index.stem}.dict beside it")
    try:
        data = gzip.decompress(data_file.read_bytes()) if data_file.suffix == ".dz" else data_file.read_bytes()
    except (OSError, EOFError) as exc:
        raise CorpusError(f"{data_file}: not a dictzip (gzip) file ({exc})") from exc
    seen = set()
    with open(index, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            fields, where = line.rstrip("\n").split("\t"), f"{index}:{number}"
            if not line.strip():
                continue
            if len(fields) < 3:
                raise CorpusError(f"{where}: expected a dictd index line: headword, offset and length, tab-separated")
            start, length = _dictd_number(fields[1], where), _dictd_number(fields[2], where)
            if fields[0].startswith("00") or (start, length) in seen:
                continue
            if start + length > len(data):
                raise CorpusError(f"{where}: the entry ends at byte {start + length}, past {data_file}'s {len(data)}")
            seen.add((start, length))
            entry = data[start : start + length].decode("utf-8").replace("{", _OPEN).replace("}", _CLOSE)
            paragraphs = (" ".join(_words_with_marks(p)) for p in re.split(f"\\n[\\s{_OPEN}{_CLOSE}]*\\n", entry))
            marked = "\n\n".join(p for p in paragraphs if p)
            text, terms = _unmark(marked)
            if text:
                yield text, terms


def _words_with_marks(paragraph: str) -> list[str]:
    """The paragraph's whitespace-separated words, a brace stand-in standing alone joined to its neighbour (the
    next word, or the last one), so that the text without them is what dropping the braces first gives."""
    words: list[str] = []
    pending = ""
    for word in paragraph.split():
        if not word.strip(_OPEN + _CLOSE):
            pending += word
        else:
            words.append(pending + word)
            pending = ""
    if pending and words:
        words[-1] += pending
    return words


def _unmark(marked: str) -> tuple[str, list[tuple[int, int]]]:
    """``marked`` without its brace stand-ins, and the spans (stripped of spaces) they enclosed in that text."""
    text: list[str] = []
    terms, opened, at = [], None, 0
    for char in marked:
        if char == _OPEN:
            opened = at
        elif char == _CLOSE:
            if opened is not None:
                term = "".join(text[opened:at])
                begin = opened + len(term) - len(term.lstrip())
                end = at - (len(term) - len(term.rstrip()))
                if end > begin and "\n" not in term:  # a link's title and address, not a term
                    terms.append((begin, end))
            opened = None
        else:
            text.append(char)
            at += 1
    return "".join(text), terms


def prose_corpus() -> list[str]:
    """The entries of ``PROSE_DICTIONARIES`` (Debian: ``apt-get install dict-foldoc dict-jargon dict-devil``)."""
    missing = [path for path in PROSE_DICTIONARIES if not Path(path).is_file()]
    if missing:
        packages = " ".join(package for _, _, package in PROSE_DICTIONARIES.values())
        raise CorpusError(
            f"the default training corpus is missing ({', '.join(missing)}): install it with `apt-get install "
            f"{packages}` (Debian, Ubuntu), or give --corpus"
        )
    return [text for path in PROSE_DICTIONARIES for text in read_corpus(Path(path))]


def reference_corpus() -> list[str]:
    """Python's reference documentation: English prose that shares no text with the benchmarks, shipped with
    every CPython (the default corpus of the reference infini-gram index)."""
    import pydoc_data.topics

    return [text for _, text in sorted(pydoc_data.topics.topics.items())]
