"""What the studies and benchmarks under studies/ share (repository scripts, not in the wheel).

Each script writes one page under docs/ and is run through tox (README, "Studies and
benchmarks"). Every page is recomputable from the repository: a script first *collects* (runs the
models) into the page's data folder, ``docs/data/<page>/`` (per-document scores, per-request
timings, the run's command, date and machine; never the bulk of the model outputs), then
*renders* the page from that folder alone. ``python studies/<script>.py --from docs/data/<page>``
renders again without running anything, and tests/test_docs.py renders every page from its
committed data and fails if one number differs. ``PAGES`` says which script writes which page;
pages whose data is lost say so (``NOT_RECOMPUTABLE``) at their top.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import lzma
import platform
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
DATA = DOCS / "data"
RUN_FILE = "run.json"

# page (relative to the repository) -> the study script (studies/<name>.py) that renders it from its data
PAGES = {
    "docs/baselines.md": "baselines",
    "docs/benchmarks/gpu.md": "gpu_bench",
    "docs/benchmarks/gpu-vllm.md": "gpu_vllm",
    "docs/benchmarks/lz.md": "lz_bench",
    "docs/benchmarks/metrics.md": "metrics_bench",
    "docs/benchmarks/mtad.md": "mtad_bench",
    "docs/benchmarks/mtad-vllm.md": "mtad_vllm_bench",
    "docs/benchmarks/overhead.md": "overhead_bench",
    "docs/benchmarks/served.md": "served_rate_bench",
    "docs/benchmarks/served-concurrency.md": "served_bench",
    "docs/benchmarks/served-client.md": "served_client_bench",
    "docs/nugget-study.md": "nugget_study",
    "docs/nugget-study-kept.md": "nugget_study",
    "docs/nugget-study-question.md": "nugget_study",
    "docs/nugget-study-question-r10.md": "nugget_study",
    "docs/nugget-study-peers.md": "nugget_study",
    "docs/nugget-study-default.md": "nugget_study",
    "docs/nugget-study-kvpress.md": "nugget_study",
    "docs/nugget-kept.md": "nugget_kept",
    "docs/nugget-kept-answer-spans.md": "nugget_kept",
    "docs/nugget-authors-recipe.md": "nugget_kept",
}
# pages that measure nothing (design notes): they say so in their first lines
DESIGN_NOTES = ("docs/nugget-engines.md",)
DESIGN_NOTE_BANNER = "A design note, not a measurement"
# reference pages (what decodebench does and how to use it; the README links to them): they say so in their first lines
REFERENCE = (
    "docs/README.md",
    "docs/methods.md",
    "docs/tasks.md",
    "docs/served.md",
    "docs/results.md",
    "docs/studies.md",
    "docs/extending.md",
)
REFERENCE_BANNER = "Reference, not a measurement"
# pages whose per-document data no longer exists: they say so, and why, in their first lines
OLD_STATISTICS = (
    "; its intervals and p-values come from the paired bootstrap used before (too small at small n: read them as "
    "not recomputed)"
)
NOT_RECOMPUTABLE = {
    "docs/benchmarks/h100.md": "run on a lent H100 before pages kept their data; rerunning needs a GPU"
    + OLD_STATISTICS,
    "docs/benchmarks/h200.md": "written on a lent H200 by the GPU command's first version (studies/gpu_bench.py at "
    "d8ba400: 7 documents, 2 rounds, no warm-up, fp32); its data is kept in docs/data/benchmarks/h200/ (`decodebench "
    "report` reads it), and the present command (`tox -e gpu`) writes docs/benchmarks/gpu.md",
    "docs/lz-study.md": "written before pages kept their data; "
    "`tox -e lz-study -- --limit 6 --max-gen-toks 384 --seeds 2 --temperatures 0,1` reruns it",
    "docs/nugget-objective.md": "its checkpoint and per-window losses were not kept; `tox -e nugget-objective` reruns "
    "it with a trained checkpoint" + OLD_STATISTICS,
}
NOT_RECOMPUTABLE_BANNER = "> **Not recomputable from the repository:**"


def data_dir(doc: str | Path) -> Path:
    """``docs/benchmarks/lz.md`` -> ``docs/data/benchmarks/lz``: where the page's data lives (a page written
    outside docs/, e.g. ``--doc /tmp/lz.md``, keeps it beside itself: ``/tmp/data/lz``)."""
    doc = (Path(doc) if Path(doc).is_absolute() else REPO / doc).resolve()
    if not doc.is_relative_to(DOCS):
        return doc.parent / "data" / doc.stem
    return DATA / doc.relative_to(DOCS).with_suffix("")


def save_json(folder: Path, name: str, value) -> Path:
    """One data file of a page (strict JSON, sorted keys, so that a rerun's diff shows what changed)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(value, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return path


def load_json(folder: Path, name: str):
    path = Path(folder) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; collect the page's data first (run the study without --from)")
    return json.loads(path.read_text())


# what a kept samples log leaves out: the document, the prompt and the model's text (the bulk); every scored
# field, the document's id and hash, the target and decodebench's per-request measurements stay
SAMPLE_BULK = ("doc", "arguments", "resps", "filtered_resps")


def write_compressed(path: Path, text: str) -> Path:
    """``text`` written to ``path`` + ``.xz`` (the same bytes for the same text: the tree stays small and a rerun's
    diff shows only what changed); ``decodebench.reports.reader.read_text`` reads it back."""
    compressed = path.with_name(path.name + ".xz")
    compressed.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    return compressed


def keep_lm_eval_run(results: Path, folder: Path) -> Path:
    """Copy an lm_eval run's results file, and its samples logs without their bulk, into a page's data folder,
    compressed; ``decodebench report`` and ``decodebench.reports.reader`` read the copy as they read the original."""
    from decodebench.reports.reader import date_id

    folder.mkdir(parents=True, exist_ok=True)
    kept = write_compressed(folder / results.name, results.read_text())
    for samples in sorted(results.parent.glob(f"samples_*_{date_id(results)}.jsonl")):
        lines = []
        for line in samples.read_text().splitlines():
            if line.strip():
                record = {k: v for k, v in json.loads(line).items() if k not in SAMPLE_BULK}
                lines.append(json.dumps(record, sort_keys=True))
        write_compressed(folder / samples.name, "\n".join(lines) + "\n")
    return kept


def kept_results(folder: Path) -> Path:
    """The one lm_eval results file kept in a page's data folder."""
    from decodebench.reports.reader import results_files

    found = results_files(folder, recursive=False)
    if len(found) != 1:
        raise FileNotFoundError(f"{folder}: expected one kept lm_eval results file, found {len(found)}")
    return found[0]


def keep_sweep_runs(produced: dict, folder: Path) -> None:
    """A sweep's lm_eval runs ({Level: [{side: results} per round]}) kept as round-N/<level>/<side>/, the layout
    decodebench.commands.sweep.read_levels reads back."""
    for level, runs in produced.items():
        for number, files in enumerate(runs, 1):
            for side, results in files.items():
                keep_lm_eval_run(results, folder / f"round-{number}" / level.folder / side)


def record_run(folder: Path, script: str, argv: list[str] | None, started: float, device: str = "cpu", **facts) -> None:
    """What the page's header says of its run: the command (``script`` is the study's ``__file__``), the date,
    how long it took, the machine."""
    from decodebench.measure.machine import describe

    command = " ".join(["python", f"studies/{Path(script).name}", *map(shlex.quote, argv or [])])
    save_json(
        folder,
        RUN_FILE,
        {
            "command": command,
            "date": f"{datetime.now(UTC):%Y-%m-%d}",
            "seconds": round(time.time() - started),
            "machine": describe(device),
            "python": platform.python_version(),
            **facts,
        },
    )


def run_header(folder: Path, title: str, tox_env: str) -> list[str]:
    """A page's title and the line that says how it was made."""
    from decodebench.measure.machine import short_name

    run = load_json(folder, RUN_FILE)
    minutes = f", {run['seconds'] / 60:.0f} min" if run.get("seconds", 0) >= 60 else ""
    words = shlex.split(run["command"])
    where = Path(folder).resolve()
    where = where.relative_to(REPO) if where.is_relative_to(REPO) else where
    render = f"python {words[1]} --from {where}"
    page = where.parent.parent / f"{where.name}.md" if where.parent.name == "data" else None  # data_dir's inverse
    if "--doc" in words[:-1]:  # a page other than the script's own: without it, --from writes the script's own page
        render += f" --doc {page or words[words.index('--doc') + 1]}"
    return [
        f"# {title}",
        "",
        f"Written by `{shown_command(words, page)}` (`tox -e {tox_env}`) on {run['date']}{minutes}, machine: "
        f"{short_name(run['machine'])}. Its data: `{where}/`; `{render}` renders this page again from it.",
        "",
    ]


def shown_command(words: list[str], page: Path | None = None, drop: tuple[str, ...] = ("--out",)) -> str:
    """A run's command as a reader reruns it from the repository: without the options in ``drop`` (a study's
    ``--out``, where lm_eval's outputs went, changes nothing on the page), ``--doc`` the page itself, any other path
    outside the repository (a scratch folder of the machine it ran on) by its file name."""
    shown, skip = [], False
    for before, word in zip(["", *words], words, strict=False):
        if skip or word in drop:
            skip = word in drop
            continue
        path = Path(word)
        if before == "--doc" and page is not None:
            word = str(page)
        elif path.is_absolute() and not path.resolve().is_relative_to(REPO):
            word = path.name
        shown.append(word)
    return " ".join(map(shlex.quote, shown))


@contextlib.contextmanager
def serving(*vllm_args: str):
    """``decodebench serve`` on a free port with these ``vllm serve`` arguments, until the block ends: its base_url."""
    import signal
    import socket
    import subprocess

    from decodebench.commands.serve import wait_until_ready

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = Path(sys.executable).with_name("decodebench")
    server = subprocess.Popen([str(script), "serve", "--port", str(port), *vllm_args], start_new_session=True)
    try:
        if not wait_until_ready(f"http://127.0.0.1:{port}", server):
            raise RuntimeError("decodebench serve did not start; its output is above")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.send_signal(signal.SIGTERM)  # as a service manager stops it; it stops vLLM and every engine process
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def page(args, argv: list[str] | None, collect: Callable[[Path, list[str]], None], render) -> int:
    """A study's main: collect into the page's data folder (unless ``--from`` names a folder to render from),
    then render the page from that folder alone."""
    folder = Path(args.from_data) if args.from_data else data_dir(args.doc)
    if not args.from_data:
        # a page's data is what one run collected: the previous run's is set aside, and restored if this one fails
        previous = folder.with_name(folder.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        if folder.exists():
            folder.rename(previous)
        try:
            collect(folder, sys.argv[1:] if argv is None else argv)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            if previous.exists():
                previous.rename(folder)
            raise
        shutil.rmtree(previous, ignore_errors=True)
    return write_doc(args.doc, render(folder))


def write_doc(doc: str | Path, text: str) -> int:
    """Write a Markdown result, show it, and say where it went."""
    doc = Path(doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    print(text)
    print(f"written to {doc}")
    return 0


# what a served page says of a run collected before the studies passed every prompt through each server first
COLD_CACHE_NOTE = (
    "**This run predates the warm-up pass.** vLLM caches prompt prefixes: the first timed run to meet each prompt "
    "on a server paid its prefill alone, and every later run found it cached, which favours whatever ran after "
    "the first run of round 1 (compare the TTFT columns at 1 in flight). Rerun the study for a run that passes "
    "every prompt through each server, untimed, before timing anything."
)


def ms_percentiles(values: dict | None) -> str:
    """A request-time distribution ({"p50": s, "p90": s, "p99": s}) as "p50/p90/p99" in ms, "-" when unmeasured."""
    return "/".join(f"{1000 * values[p]:.0f}" for p in ("p50", "p90", "p99")) if values else "-"


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


def generate_exactly(model, tokenizer, input_ids, processors: list, new_tokens: int) -> None:
    """Greedy ``generate`` of exactly ``new_tokens`` tokens a row after unpadded prompts (``min_new_tokens``: every
    arm of a timing comparison does the same work)."""
    import torch
    from transformers import LogitsProcessorList

    with torch.inference_mode():
        model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList(processors),
            pad_token_id=tokenizer.eos_token_id,
        )


def task_docs(task_name: str, limit: int | None = None) -> tuple[object, list[dict]]:
    """An lm-eval task (decodebench's or lm-eval's) and its first ``limit`` evaluation documents,
    so that studies use the task's own prompts (``task.doc_to_text(doc)``) instead of copies."""
    from lm_eval.tasks import TaskManager

    task = TaskManager().load([task_name])["tasks"][task_name]
    docs = list(task.eval_docs)
    return task, docs[:limit] if limit else docs


def add_load_options(parser: argparse.ArgumentParser, limit: int, rounds: int, max_gen_toks: int, out: str) -> None:
    """A served benchmark's options: documents per task, rounds, new tokens at most, lm_eval's output folder."""
    parser.add_argument("--limit", type=int, default=limit, help=f"documents per task (default {limit})")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"rounds, the order alternating (default {rounds})")
    parser.add_argument("--max-gen-toks", type=int, default=max_gen_toks, help=f"new tokens at most ({max_gen_toks})")
    parser.add_argument("--out", default=out, help=f"lm_eval output folder (default {out})")


def load_study_main(argv: list[str] | None, description: str, doc: str, collect, render, **defaults) -> int:
    """A served benchmark's main: its load options (``add_load_options``, with ``defaults``), then ``page``;
    ``collect(folder, command, limit, rounds, max_gen_toks, out)``."""
    parser = doc_parser(description, doc)
    add_load_options(parser, **defaults)
    args = parser.parse_args(argv)
    options = (args.limit, args.rounds, args.max_gen_toks, args.out)
    return page(args, argv, lambda folder, command: collect(folder, command, *options), render)


def doc_parser(description: str, doc: str) -> argparse.ArgumentParser:
    """A script's command line: its first docstring line as description, where it writes (``--doc``), and
    ``--from`` (render the page from a data folder without running anything)."""
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    # the default is the repository's page wherever the script is run from; a --doc given is the caller's path
    parser.add_argument("--doc", default=str(REPO / doc), help=f"the Markdown document to write (default {doc})")
    parser.add_argument(
        "--from",
        dest="from_data",
        default=None,
        metavar="DIR",
        help=f"render the page from this data folder alone, running nothing ({data_dir(doc).relative_to(REPO)})",
    )
    return parser
