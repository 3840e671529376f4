"""What the studies and benchmarks under studies/ share (repository scripts, not in the wheel).

Each script writes one document under docs/ and is run through tox (README, "Studies and
benchmarks"); every figure in docs/ comes from one of them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def write_doc(doc: str | Path, text: str) -> int:
    """Write a Markdown result, show it, and say where it went."""
    doc = Path(doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    print(text)
    print(f"written to {doc}")
    return 0


def median_seconds(fn: Callable[[], object], repeats: int, synchronize: Callable[[], None] = lambda: None) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after one warm-up call."""
    fn()
    synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def task_docs(task_name: str, limit: int | None = None) -> tuple[object, list[dict]]:
    """An lm-eval task (decodebench's or lm-eval's) and its first ``limit`` evaluation documents,
    so that studies use the task's own prompts (``task.doc_to_text(doc)``) instead of copies."""
    from lm_eval.tasks import TaskManager

    task = TaskManager().load([task_name])["tasks"][task_name]
    docs = list(task.eval_docs)
    return task, docs[:limit] if limit else docs


def doc_parser(description: str, doc: str) -> argparse.ArgumentParser:
    """A script's command line: its first docstring line as description, and where it writes (``--doc``)."""
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    parser.add_argument("--doc", default=doc, help=f"the Markdown document to write (default {doc})")
    return parser
