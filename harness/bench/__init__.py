"""Benchmarks and studies that write the docs under docs/ (``decodebench bench NAME``, ``*-study``)."""

from __future__ import annotations

from pathlib import Path


def write_doc(doc: str | Path, text: str) -> int:
    """Write a Markdown result, show it, and say where it went."""
    doc = Path(doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    print(text)
    print(f"written to {doc}")
    return 0
