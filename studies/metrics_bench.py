"""Metric benchmarks (``tox -e metrics-bench``, ``python studies/metrics_bench.py`` -> docs/benchmarks/metrics.md).

- degenerate_repetition on a 32k-token output (goal: under 50 ms);
- spider_execution_accuracy over 1,000 predictions on the mini databases;
- infinigram_agreement over 100k tokens against a 10M-token index (goal: under 10 s on 2 cores),
  with time and memory. The index is built in a temporary folder from the reference corpus's tokens:
  20,000 documents of 500 tokens cut at random places with 5% of the tokens replaced, so that
  long matches exist but are not exact copies; the 100k scored tokens are cut the same way.
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from common import doc_parser, load_json, median_seconds, page, record_run, run_header, save_json

DOC = "docs/benchmarks/metrics.md"
TIMINGS_FILE = "timings.json"


def _reference_tokens(tokenizer) -> np.ndarray:
    from decodebench.data.infinigram_index import reference_corpus

    return np.concatenate(
        [np.asarray(tokenizer(doc, add_special_tokens=False).input_ids) for doc in reference_corpus()]
    )


def _noisy_windows(tokens: np.ndarray, count: int, length: int, vocab: int, rng) -> list[list[int]]:
    starts = rng.integers(0, len(tokens) - length, size=count)
    windows = np.stack([tokens[s : s + length] for s in starts])
    noise = rng.random(windows.shape) < 0.05
    windows[noise] = rng.integers(0, vocab, size=int(noise.sum()))
    return windows.tolist()


def repetition_rows(tokenizer, tokens: np.ndarray) -> list[tuple[str, float]]:
    from decodebench.metrics import find_degenerate_repetition

    normal = tokenizer.decode(np.resize(tokens, 32768).tolist())
    looping = tokenizer.decode(np.concatenate([tokens[:24576], np.tile(tokens[:16], 512)]).tolist())
    rows = []
    for name, text in (("32k tokens of normal text", normal), ("32k tokens ending in a loop", looping)):
        seconds = median_seconds(lambda text=text: find_degenerate_repetition(text), 5)
        rows.append((f"degenerate_repetition, {name} ({len(text):,} characters)", seconds))
    return rows


def spider_rows() -> list[tuple[str, float]]:
    import importlib.util

    from decodebench.data.paths import TASKS_DIR
    from decodebench.metrics import spider_execution_accuracy

    spec = importlib.util.spec_from_file_location("spider_utils", TASKS_DIR / "spider" / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    rows = list(utils.load_mini()["validation"])
    variants = [lambda q: q, lambda q: f"```sql\n{q};\n```\nThis query answers it.", lambda q: "SELECT 1"]
    work = [(variants[i % 3](row["query"]), row["query"], row["db_paths"][0]) for i, row in enumerate(rows * 50)]
    start = time.perf_counter()
    for prediction, gold, db in work:
        spider_execution_accuracy(prediction, gold, db)
    return [
        (f"spider_execution_accuracy, {len(work):,} predictions on the mini databases", time.perf_counter() - start)
    ]


def infinigram_rows(
    tokenizer, tokens: np.ndarray, checkpoint: str, workdir: str
) -> tuple[list[tuple[str, float]], dict]:
    from decodebench.data.infinigram_index import Index, build_index
    from decodebench.metrics import infinigram_agreement

    rows = []
    docs = _noisy_windows(tokens, 20_000, 500, len(tokenizer), np.random.default_rng(0))
    path = Path(workdir) / "bench-10M"
    start = time.perf_counter()
    build_index(docs, path, tokenizer, "embedded", log=print, corpus="noisy windows of the reference corpus")
    rows.append(("building the 10M-token index (one core)", time.perf_counter() - start))
    index = Index(path, tokenizer)
    scored = [
        t for window in _noisy_windows(tokens, 200, 500, len(tokenizer), np.random.default_rng(1)) for t in window
    ]
    start = time.perf_counter()
    result = infinigram_agreement(scored, index)
    seconds = time.perf_counter() - start
    rows.append((f"infinigram_agreement, {result.tokens:,} tokens against {index.size:,} tokens", seconds))
    extra = {
        "agreement": result.agreement,
        "us_per_token": seconds / result.tokens * 1e6,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    return rows, extra


def collect(folder: Path, argv: list[str]) -> None:
    from transformers import AutoTokenizer

    from decodebench.data.embedded import ensure_embedded_model

    started = time.time()
    checkpoint = str(ensure_embedded_model(log=print))
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokens = _reference_tokens(tokenizer)
    rows = repetition_rows(tokenizer, tokens)
    print("repetition done; spider ...", flush=True)
    rows += spider_rows()
    print("spider done; infini-gram ...", flush=True)
    with tempfile.TemporaryDirectory() as workdir:  # built each time, so that the page always times the build
        infini, extra = infinigram_rows(tokenizer, tokens, checkpoint, workdir)
    rows += infini
    save_json(folder, TIMINGS_FILE, {"rows": [[name, seconds] for name, seconds in rows], **extra})
    record_run(folder, __file__, argv, started)


def render(folder: Path) -> str:
    timings = load_json(folder, TIMINGS_FILE)
    lines = [
        *run_header(folder, "Metric benchmarks", "metrics-bench"),
        "| what | seconds |",
        "|---|---:|",
        *(f"| {name} | {seconds:.3f} |" for name, seconds in timings["rows"]),
        "",
        f"infini-gram: {timings['us_per_token']:.0f} µs per scored token, agreement {timings['agreement']:.3f} on "
        f"the noisy copies, peak memory of the benchmark process {timings['max_rss_mb']:.0f} MB (model tokenizer "
        "and the index loaded into RAM included). Goals: repetition under 0.05 s on 32k tokens; infini-gram under "
        "10 s for 100k tokens. Each time is one run (the repetition rows: the median of 5 after a warm-up), "
        "measured against its goal, not compared with another run.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return page(doc_parser(__doc__, DOC).parse_args(argv), argv, collect, render)


if __name__ == "__main__":
    raise SystemExit(main())
