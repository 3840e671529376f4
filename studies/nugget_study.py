"""The nugget study: how much quality a document kept as 1/ratio of its tokens retains, on real data, and what
the smaller cache buys in throughput when many rows decode together.

``tox -e nugget-study`` (``python studies/nugget_study.py``; ``tox -e kvpress,nugget-study -- --kvpress-python
.tox/kvpress/bin/python`` adds kvpress's presses) runs ``lm_eval --model nugget`` with the embedded model on
squad_mini (500 real SQuAD v1.1 dev questions) and cnndm_mini (100 real CNN/DailyMail test articles) at each ratio
(5 and 10): full context once,
then the paper's method (``selector=trained``: the compressor shipped for that ratio, models/nugget/weights/),
its scorer alone on the frozen model, the training-free delimiter stand-in, and the peers truncation,
StreamingLLM and query-aware attention (SnapKV's kin); with ``--kvpress-python`` also kvpress's presses (KVzip,
Expected Attention, KNorm, StreamingLLM, TOVA, SnapKV, PyramidKV: ``--presses``) on the same documents in that
interpreter (kvpress needs transformers<5.3: ``tox -e kvpress``), each compressing exactly the document, while the
lm_eval rows run (``--kvpress-jobs`` processes side by side), and then, alone on the machine, each press's prefill and
the default's (``answer-spans``) over the plain prefill of the same documents (``--cost-limit``), the order rotating.

For every row: the score with its 95% interval (Wilson for 0/1 accuracy, Student's t for ROUGE), the share of
full context's score, the paired difference against full context on the same documents (McNemar's exact test
for accuracy, the paired sign-flip test for ROUGE), the compression achieved, the document's KV bytes per row,
time to first token (p50) and peak memory; then every compressor against every other at each ratio, paired (with
kvpress's presses: the default against each press, and against the best query-agnostic one first).

Throughput: full context and the trained method (ratio 10) at batch 1, 8 and 32 on the same squad_mini questions, in
interleaved rounds (the order alternating each round); tokens/s, the ratio to full context at the same batch
paired per round, the KV cache each row holds, and the largest batch whose KV cache fits a fixed budget.

Every run's results and per-document scores are kept once, compressed, in docs/data/nugget-runs/ (one copy of a run
however many study pages read it); each page's data folder names the runs it reads (runs.json) beside its own
files, and ``--from`` renders the page from them alone.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import common
from common import doc_parser, keep_lm_eval_run, kept_results, load_json, page, record_run, run_header, save_json
from kvpress_peers import PRESSES

from decodebench.commands.runs import LmEvalRun, offline_env

TASKS = {"squad_mini": ("normalized_accuracy", "accuracy"), "cnndm_mini": ("rougeLsum", "ROUGE-Lsum")}
OURS = (
    "trained",
    "scorer only",
    "answer-spans",
    "delimiter",
    "salience",
    "question-overlap",
    "truncation",
    "streaming",
    "query-attention",
)
THROUGHPUT_TASK = "squad_mini"
WINDOW = 64  # kvpress 0.5.5's SnapKV and PyramidKV observation window (their default)
# beside each study page's data folder: the kept lm_eval runs of every nugget study, one copy of each
RUN_STORE = "nugget-runs"
# in a study page's data folder: {run folder name: {task: its kept run, relative to the store}}
RUNS_FILE = "runs.json"
# beside a run the study made (in its output folder and in the store): the command that made it
MAKER_FILE = "made-by.json"


def nugget_run(
    name: str, ratio: float | None, task: str, output_path: Path, wrapper: str = "kept", **options
) -> LmEvalRun:
    """``lm_eval --model nugget`` on the embedded model for one row of the study (``name`` at ``ratio``; what comes
    before the document ``wrapper``: kept whole or compressed with it)."""
    selector = {"selector": "trained", "adapters": "false"} if name == "scorer only" else {"selector": name}
    compressed = {"ratio": f"{ratio:g}", "wrapper": wrapper} if ratio else {}
    return LmEvalRun(
        model="nugget",
        model_args={"pretrained": "embedded", **selector, **compressed},
        tasks=[task],
        output_path=output_path,
        **options,
    )


def label(name: str, ratio: float | None) -> str:
    return name + (f" @ {ratio:g}" if ratio else "")


def folder_name(name: str, ratio: float | None) -> str:
    return label(name, ratio).replace(" ", "-").replace("@", "r")


class Row:
    """One (selector, ratio) run, read back per document from its kept lm_eval results."""

    def __init__(
        self,
        name: str,
        ratio: float | None,
        results: list[Path] = (),
        press: dict | None = None,
        left_out_reason: str | None = None,
    ):
        self.name, self.ratio = name, ratio
        self.left_out: dict[str, list[int]] = {}  # per task: documents a press could not apply to
        self.left_out_reason = left_out_reason
        self.notes: dict[str, str] = {}  # per task: what a press says of how it behaved there
        self.scores: dict[str, dict[int, float]] = {}
        self.ttft: dict[str, list[float]] = {}
        self.kv_bytes: dict[str, list[int]] = {}
        self.achieved: dict[str, float | None] = {}
        self.peak_memory: dict[str, int | None] = {}
        self.machines: dict[str, dict] = {}  # per task: a row's tasks may have run on different machines
        for path in results:
            self._read_lm_eval(path)
        if press is not None:
            for task, values in press.items():
                self.scores[task] = {int(k): v for k, v in values["scores"].items()}
                self.achieved[task] = values.get("achieved_ratio")
                if values.get("left_out"):
                    self.left_out[task] = values["left_out"]
                if values.get("note"):
                    self.notes[task] = values["note"]
                self.machines[task] = values["machine"]
                if values.get("document_kv_bytes"):
                    self.kv_bytes[task] = values["document_kv_bytes"]

    def _read_lm_eval(self, path: Path) -> None:
        from decodebench.reports.reader import read_run, read_text

        run = read_run(path)
        machine = json.loads(read_text(path))["config"]["decodebench"]["machine"]
        for task, (metric, _) in TASKS.items():
            result = run.tasks.get(task)
            if result is None:
                continue
            self.machines[task] = machine
            self.scores[task] = {key[0]: value for key, value in result.per_document.get(metric, {}).items()}
            summary = result.measurement or {}
            self.achieved[task] = (summary.get("method") or {}).get("achieved_ratio")
            self.peak_memory[task] = summary.get("peak_memory_bytes")
            ttft, kv = [], []
            for line in read_text(result.samples_file).splitlines():
                for record in json.loads(line).get("decodebench", []):
                    if record.get("ttft_s") is not None:
                        ttft.append(record["ttft_s"])
                    stats = record.get("method_stats", {})
                    kv.append(stats.get("document_kv_bytes_kept", stats.get("kv_bytes_at_decode_start", 0)))
            self.ttft[task], self.kv_bytes[task] = ttft, kv


def run_store(folder: Path) -> Path:
    """Where the kept runs of the study page whose data is ``folder`` live (beside it: docs/data/nugget-runs)."""
    return Path(folder).parent / RUN_STORE


def keep_run(folder: Path, name: str, ratio: float | None, task: str, results: Path) -> None:
    """Keep an lm_eval run in the store (once: a run another page already keeps is not copied again) and name it
    in the page's runs.json."""
    from decodebench.reports.reader import date_id

    where = f"{folder_name(name, ratio)}/{task}-{date_id(results)}"
    kept = run_store(folder) / where
    maker = next((p / MAKER_FILE for p in (results.parent, results.parent.parent) if (p / MAKER_FILE).is_file()), None)
    if not kept.is_dir():
        # made aside and moved in whole: a study sharing the store may read this run the moment its folder exists
        kept.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{kept.name}-", dir=kept.parent))
        try:
            keep_lm_eval_run(results, staging)
            if maker:
                shutil.copyfile(maker, staging / MAKER_FILE)
            try:
                staging.rename(kept)
            except OSError:
                if not kept.is_dir():
                    raise
                # else the other study kept it first: its copy stands
        finally:  # nothing half made stays in the store, whatever stopped the copy
            shutil.rmtree(staging, ignore_errors=True)
    if maker and not (kept / MAKER_FILE).is_file():
        shutil.copyfile(maker, kept / MAKER_FILE)
    runs = load_json(folder, RUNS_FILE) if (folder / RUNS_FILE).is_file() else {}
    runs.setdefault(folder_name(name, ratio), {})[task] = where
    save_json(folder, RUNS_FILE, runs)


def kept_runs(folder: Path) -> dict[str, dict[str, Path]]:
    """{run folder name: {task: kept results file}} of the runs the page whose data is ``folder`` reads."""
    return {
        run: {task: kept_results(run_store(folder) / where) for task, where in sorted(tasks.items())}
        for run, tasks in load_json(folder, RUNS_FILE).items()
    }


@functools.cache
def method_code() -> str:
    """sha256 of the nugget method's source as installed (its kernels and its model folder), in path order."""
    import decodebench.kernels.nugget as kernels
    import decodebench.models.nugget as method

    files = [Path(kernels.__file__), *sorted(Path(method.__file__).parent.glob("*.py"))]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def run_lm_eval(
    out: Path,
    name: str,
    ratio: float | None,
    task: str,
    limit: int | None,
    batch: int,
    weights: str | None = None,
    wrapper: str = "kept",
    maker: dict | None = None,
    wait: bool = True,
) -> Path | None:
    """One lm_eval run (reused when a finished one is under ``out``: delete its folder to redo it). A run is kept
    under the sha256 of the method's code (``method_code``) and, of a trained checkpoint, of its weights
    (``weights``), so neither changed selection code nor retrained weights are ever answered by an old run; a
    compressed run under its layout (``wrapper``). Only a run the study made is reused: it writes ``maker`` (the
    command) beside each run it makes, and a finished run without it, put there by something else, is run again.

    Studies sharing one ``out`` side by side make each run once: a run is made under a lock beside its folder, and
    while another study holds it this one waits for that run to reuse it or, without ``wait``, returns None."""
    from filelock import FileLock, Timeout

    folder = out / folder_name(name, ratio) / f"{task}-limit{limit or 'all'}-batch{batch}-code{method_code()[:12]}"
    if ratio:
        folder = folder.with_name(f"{folder.name}-wrapper-{wrapper}")
    if weights:
        folder = folder.with_name(f"{folder.name}-weights{weights[:12]}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        held = FileLock(folder.with_name(f"{folder.name}.lock")).acquire(timeout=-1 if wait else 0)
    except Timeout:
        print(f"{label(name, ratio)}, {task}: another study sharing {out} is making it; coming back to it", flush=True)
        return None
    with held:
        existing = sorted(folder.glob("**/results_*.json"))
        if existing and (folder / MAKER_FILE).is_file():
            print(f"{label(name, ratio)}, {task}: reusing {existing[-1]}", flush=True)
            return existing[-1]
        if existing:
            print(
                f"{label(name, ratio)}, {task}: {folder} holds a run the study did not make; running it again",
                flush=True,
            )
            shutil.rmtree(folder)
        run = nugget_run(name, ratio, task, folder, wrapper=wrapper, limit=limit, batch_size=batch)
        results = run.run_or_raise(f"{label(name, ratio)}, {task}")
        (folder / MAKER_FILE).write_text(json.dumps(maker or {"script": "studies/nugget_study.py"}, indent=1) + "\n")
        return results


@functools.cache
def peers_code() -> str:
    """sha256 of the kvpress peers' script: a kept peers file answers only the code that made it."""
    return hashlib.sha256(Path(__file__).with_name("kvpress_peers.py").read_bytes()).hexdigest()


def peers_file(out: Path, ratio: float, task: str, limit: int | None, kind: str = "quality", batch: int = 1) -> Path:
    """Where the kvpress peers' output for one ratio and task is kept: under their code's sha256 and, for answers,
    the batch they were decoded in (a batch's arithmetic may break a near tie another way)."""
    name = f"{task}-limit{limit or 'all'}-code{peers_code()[:12]}"
    if kind == "quality":
        return out / f"kvpress-r{ratio:g}" / (f"{name}.json" if batch == 1 else f"{name}-batch{batch}.json")
    return out / f"kvpress-r{ratio:g}" / f"{name}-{kind}.json"


def has_presses(peers: Path, presses: str) -> bool:
    """Whether a kept peers file has finished every press of ``presses`` (comma-separated): kvpress_peers.py writes it
    after each batch and names a press finished only at its end, so a run stopped midway leaves one that is run
    again (going on from its last batch), never read as finished."""
    if not peers.is_file():
        return False
    wanted = {name.strip() for name in presses.split(",") if name.strip()}
    return wanted <= set(json.loads(peers.read_text()).get("finished", []))


def kvpress_command(args, model_path: str, ratio: float, task: str, limit: int | None, kind: str) -> list[str]:
    """The kvpress peers' command for one ratio and task (its documents written beside its output)."""
    target = peers_file(Path(args.out).resolve(), ratio, task, limit, kind, args.kvpress_batch_size)
    items = target.with_name(f"{task}-limit{limit or 'all'}.items.json")
    items.parent.mkdir(parents=True, exist_ok=True)
    items.write_text(json.dumps(kvpress_items({task: limit})))
    return [
        *(args.kvpress_python, str(Path(__file__).with_name("kvpress_peers.py")), "--skip-refused"),
        *("--checkpoint", model_path, "--ratio", f"{ratio:g}", "--items", str(items), "--presses", args.presses),
        *("--batch-size", str(args.kvpress_batch_size)),
        *("--out", str(target), *(["--cost"] if kind == "cost" else [])),
    ]


def start_kvpress_quality(args, model_path: str) -> tuple:
    """Start the kvpress presses' quality runs not kept yet (each ratio and task its own process, at most
    ``--kvpress-jobs`` at a time, each with its share of the cores: a 135M model's decoding is bound by per-step
    overheads, so processes side by side finish sooner than one with every core); they run while the lm_eval rows
    run. Returns what ``finish_kvpress_quality`` waits on."""
    import threading

    pending = []
    for ratio in args.ratios:
        for task, limit in args.limit.items():
            target = peers_file(Path(args.out).resolve(), ratio, task, limit, batch=args.kvpress_batch_size)
            if not has_presses(target, args.presses):
                pending.append(
                    (
                        f"kvpress presses @ {ratio:g} on {task}",
                        kvpress_command(args, model_path, ratio, task, limit, "quality"),
                        target,
                    )
                )
    threads = str(max(1, (os.cpu_count() or 1) // args.kvpress_jobs))
    env = {**offline_env(), "OMP_NUM_THREADS": threads}
    slots = threading.Semaphore(args.kvpress_jobs)
    started: list[tuple[str, subprocess.Popen, Path]] = []

    def run_all():
        for what, command, target in pending:
            slots.acquire()
            log = target.with_suffix(".log").open("w")
            print(f"\n{what} (log: {log.name}): {' '.join(command)}", flush=True)
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            started.append((what, process, target))
            threading.Thread(
                target=lambda p=process, f=log: (p.wait(), f.close(), slots.release()), daemon=True
            ).start()

    launcher = threading.Thread(target=run_all, daemon=True)
    launcher.start()
    return launcher, started, len(pending)


def finish_kvpress_quality(handle) -> None:
    """Wait for the kvpress runs ``start_kvpress_quality`` started; a failed one stops the study, naming its log."""
    launcher, started, count = handle
    launcher.join()
    for what, process, target in started:
        if process.wait() != 0:
            raise SystemExit(f"{what} failed; its output: {target.with_suffix('.log')}")
    assert len(started) == count


def kvpress_cost(args, model_path: str, ratio: float) -> dict[str, dict]:
    """Each press's prefill against the plain prefill per document, in the kvpress interpreter, alone on the machine
    (after every quality run): {task: the cost file's content}."""

    found = {}
    for task, limit in args.cost_limit.items():
        target = peers_file(Path(args.out).resolve(), ratio, task, limit, "cost")
        command = kvpress_command(args, model_path, ratio, task, limit, "cost")
        print(f"\nkvpress prefill cost @ {ratio:g} on {task}: {' '.join(command)}", flush=True)
        if subprocess.call(command, env=offline_env()) != 0:
            raise SystemExit("the kvpress cost run failed; see its output above")
        found[task] = json.loads(target.read_text())
    return found


def default_cost(ratio: float, limits: dict[str, int | None]) -> dict:
    """The default compressor's prefill (``--model nugget``'s answer-span scorer reading the encoding pass, then the
    kept positions) against the plain prefill of the same opening and document, per document, the order alternating
    from document to document, with each side's peak memory: {task: {side: {doc_id: [seconds, peak bytes]}}}. A
    discarded prefill of each side first pays the first-run costs."""
    import torch
    from lm_eval.api.registry import get_model
    from nugget_prefill_bench import prefill, prompt_tokens
    from tqdm import tqdm

    from decodebench.measure.memory import open_memory_meter

    device = "cuda" if torch.cuda.is_available() else "cpu"  # lm_eval's own default is cuda, even without one
    lm = get_model("nugget").create_from_arg_string(
        f"pretrained=embedded,selector=answer-spans,ratio={ratio:g},device={device}"
    )
    meter = open_memory_meter(lm.device.type, lm.device)

    def measured(side: str, ids: list[int], n: int, opening: int) -> tuple[float, int | None]:
        meter.start()
        started = time.perf_counter()
        with torch.inference_mode():
            way = "shared" if side == "answer-spans" else side  # the default reads the encoding pass's states
            prefill(lm, way, torch.tensor([ids[:n]], device=lm.device), opening, ids[n:], ratio)
        return time.perf_counter() - started, meter.peak_bytes()

    cost: dict[str, dict] = {}
    sides = ("plain", "answer-spans")
    for name, limit in limits.items():
        task, docs = common.task_docs(name, limit)
        prompts = [prompt_tokens(lm, task, doc)[1:] for doc in docs]
        for side in sides:
            measured(side, *prompts[0])
        for doc_id, prompt in enumerate(tqdm(prompts, desc=f"default prefill cost @ {ratio:g} on {name}")):
            for side in sides if doc_id % 2 == 0 else sides[::-1]:
                seconds, peak = measured(side, *prompt)
                cost.setdefault(name, {}).setdefault(side, {})[str(doc_id)] = [seconds, peak]
    return {"memory_source": meter.source, "by_task": cost}


def kvpress_rows(folder: Path, ratio: float) -> list[Row]:
    """The kept kvpress peers at ``ratio`` as rows; a press that could not apply to some documents names them."""
    per_press: dict[str, dict] = {}
    reasons: dict[str, str] = {}
    for path in sorted((folder / "kvpress" / f"r{ratio:g}").glob("*.json")):
        if path.name.endswith("-cost.json"):
            continue
        peers = json.loads(path.read_text())
        for press in PRESSES:
            if press in peers:
                for values in peers[press].values():
                    values["machine"] = peers["machine"]
                per_press.setdefault(press, {}).update(peers[press])
                reasons.update(peers.get("left_out", {}))
    rows = []
    for press in (p for p in PRESSES if p in per_press):
        row = Row(f"kvpress {press}", ratio, press=per_press[press], left_out_reason=reasons.get(press))
        for task, values in per_press[press].items():
            if press == "SnapKV" and values.get("document_tokens"):
                # the window's scores are padded above every other score: a budget within it keeps window tokens
                within = sum(math.ceil(n / ratio) <= WINDOW for n in values["document_tokens"])
                row.notes[task] = (
                    f"keeps no more document tokens than its {WINDOW}-token observation window on {within} of "
                    f"{len(values['document_tokens'])} documents, and ranks that window above every other token: "
                    f"there it keeps only tokens of the document's last {WINDOW}"
                )
        rows.append(row)
    return rows


def kvpress_items(limits: dict[str, int | None]) -> list[dict]:
    """Each document of the study's tasks split as ``--model nugget`` splits it (the task's own prompt)."""
    from decodebench.models.nugget import NuggetConfig

    split = NuggetConfig.defaults().split
    items = []
    for name, limit in limits.items():
        task, docs = common.task_docs(name, limit)
        generation = task.config.generation_kwargs
        for doc_id, doc in enumerate(docs):
            document, _, question = task.doc_to_text(doc).rpartition(split)
            references = doc["answers"]["text"] if "answers" in doc else [task.doc_to_target(doc)]
            items.append(
                {
                    "task": name,
                    "doc_id": doc_id,
                    "document": document,
                    "question": split + question,
                    "max_new": generation["max_gen_toks"],
                    "stop": [s for s in generation.get("until", []) if s],
                    "references": references,
                }
            )
    return items


# -- collecting ----------------------------------------------------------------------------------------------------
def collect(folder: Path, argv: list[str], args) -> None:
    from decodebench.data.embedded import ensure_embedded_model
    from decodebench.models.nugget.shipped import shipped_checkpoint, shipped_span_scorer, verify

    started = time.time()
    if args.kvpress_python:
        # the lm_eval rows share the cores with the kvpress runs: one thread each, waiting threads asleep (set before
        # lm_eval's fork server starts; tox.ini's py env measures why: spinning threads starve the other processes)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out).resolve()
    model_path = str(ensure_embedded_model(log=print))
    ratios = set(args.ratios) if {"trained", "scorer only"} & set(args.selectors) else set()
    ratios |= {args.throughput_ratio} if args.rounds else set()
    checkpoints = {f"{r:g}": verify(shipped_checkpoint(r), required=True) for r in sorted(ratios)}
    save_json(folder, "checkpoints.json", checkpoints)
    spans = verify(shipped_span_scorer(), required=True) if "answer-spans" in args.selectors else None
    if spans:
        save_json(folder, "span_scorer.json", spans)
    runs = [("full", None)] + [(name, ratio) for ratio in args.ratios for name in args.selectors]
    maker = {
        "script": "studies/nugget_study.py",
        "command": shlex.join(["python", "studies/nugget_study.py", *argv]),
        "started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
    }
    kvpress_runs = start_kvpress_quality(args, model_path) if args.kvpress_python else None

    def make(name: str, ratio: float | None, task: str, limit: int | None, wait: bool) -> Path | None:
        weights = checkpoints[f"{ratio:g}"]["sha256"] if name in ("trained", "scorer only") else None
        weights = spans["sha256"] if name == "answer-spans" else weights
        results = run_lm_eval(out, name, ratio, task, limit, args.batch_size, weights, args.wrapper, maker, wait)
        if results is not None:
            keep_run(folder, name, ratio, task, results)
        return results

    rows = [(name, ratio, task, limit) for name, ratio in runs for task, limit in args.limit.items()]
    # a row another study sharing ``out`` is making now is passed over, then waited for once the others are done
    later = [row for row in rows if make(*row, wait=False) is None]
    for row in later:
        make(*row, wait=True)
    if args.kvpress_python:
        finish_kvpress_quality(kvpress_runs)
        for ratio in args.ratios:
            for task, limit in args.limit.items():
                save_json(
                    folder / "kvpress" / f"r{ratio:g}",
                    f"{task}.json",
                    json.loads(peers_file(out, ratio, task, limit, batch=args.kvpress_batch_size).read_text()),
                )
        # what compressing costs, measured alone on the machine once every quality run is done
        for ratio in args.ratios:
            for task, cost in kvpress_cost(args, model_path, ratio).items():
                save_json(folder / "kvpress" / f"r{ratio:g}", f"{task}-cost.json", cost)
            if "answer-spans" in args.selectors:
                save_json(folder / "default-cost", f"r{ratio:g}.json", default_cost(ratio, args.cost_limit))
    if args.rounds:
        save_json(folder, "throughput.json", measure_throughput(out / "throughput", args))
    record_run(folder, __file__, argv, started, quality_batch_size=args.batch_size)


def measure_throughput(out: Path, args) -> dict:
    """Full context and the trained method at each batch size on the same questions, in rounds whose order
    alternates; every run's tokens, seconds, memory and KV per row."""
    from decodebench.reports.reader import read_run

    shutil.rmtree(out, ignore_errors=True)  # timings are never reused from another run of the study
    sides = [("full", None), ("trained", args.throughput_ratio)]
    runs = []
    for round_ in range(args.rounds):
        for batch in args.batches:
            order = sides if (round_ + args.batches.index(batch)) % 2 == 0 else sides[::-1]
            for name, ratio in order:
                run = nugget_run(
                    name,
                    ratio,
                    THROUGHPUT_TASK,
                    out / f"round{round_}" / f"batch{batch}" / folder_name(name, ratio),
                    wrapper=args.wrapper,
                    limit=args.throughput_limit,
                    batch_size=batch,
                    gen_kwargs=f"max_gen_toks={args.throughput_max_gen_toks}",
                    log_samples=False,
                )
                measured = (
                    read_run(run.run_or_raise(f"throughput {label(name, ratio)} batch {batch}"))
                    .tasks[THROUGHPUT_TASK]
                    .measurement
                )
                method = measured["method"]
                runs.append(
                    {
                        "round": round_,
                        "batch": batch,
                        "selector": name,
                        "ratio": ratio,
                        "requests": measured["requests"],
                        "prompt_tokens": measured["prompt_tokens"],
                        "new_tokens": measured["new_tokens"],
                        "seconds": measured["generate_seconds"],
                        "peak_memory_bytes": measured["peak_memory_bytes"],
                        "kv_bytes_at_decode_start": method["kv_bytes_at_decode_start"],
                        "achieved_ratio": method.get("achieved_ratio"),
                    }
                )
    return {
        "task": THROUGHPUT_TASK,
        "limit": args.throughput_limit,
        "batches": args.batches,
        "rounds": args.rounds,
        "max_gen_toks": args.throughput_max_gen_toks,
        "kv_budget_mib": args.kv_budget_mib,
        "runs": runs,
    }


# -- rendering -----------------------------------------------------------------------------------------------------
def read_rows(folder: Path) -> tuple[list[Row], list[float]]:
    rows, ratios = [], []
    for run, tasks in sorted(kept_runs(folder).items(), key=lambda item: (item[0] != "full", item[0])):
        prefix, _, ratio = run.partition("-r-")
        name = {folder_name(known, None): known for known in ("full", *OURS)}[prefix]
        ratio_value = float(ratio) if ratio else None
        if ratio_value and ratio_value not in ratios:
            ratios.append(ratio_value)
        rows.append(Row(name, ratio_value, list(tasks.values())))
    ratios.sort()
    order = {name: i for i, name in enumerate(OURS)}
    full = [r for r in rows if r.name == "full"]
    ours = sorted((r for r in rows if r.name != "full"), key=lambda r: (r.ratio, order.get(r.name, len(order))))
    by_ratio = []
    for ratio in ratios:
        by_ratio += [r for r in ours if r.ratio == ratio] + kvpress_rows(folder, ratio)
    return full + by_ratio, ratios


def made_elsewhere(folder: Path, run: dict) -> list[str]:
    """The rows the page cannot show its study made: kept runs without the study's maker file (the study writes it
    beside each run it makes) that finished before this page's command started (so it did not make them either;
    its reuse rule found them in its output folder). The start is taken as the last kept run's finish less the
    command's duration: never later than the true start, so a row named here surely predates it."""
    from datetime import timedelta

    finished = {
        (run_name, task): (
            datetime.strptime(where.rpartition("/")[2].partition("-")[2], "%Y-%m-%dT%H-%M-%S.%f"),
            (run_store(folder) / where / MAKER_FILE).is_file(),
        )
        for run_name, tasks in load_json(folder, RUNS_FILE).items()
        for task, where in tasks.items()
    }
    started = max(when for when, _ in finished.values()) - timedelta(seconds=run.get("seconds", 0))
    earlier = sorted(
        (when, name, task) for (name, task), (when, made) in finished.items() if when < started and not made
    )
    if not earlier:
        return []
    return [
        f"- **not made by this command as run:** {len(earlier)} of the page's {len(finished)} runs finished before "
        f"it started ({started:%Y-%m-%d %H:%M} UTC at the latest) and carry no record of the study having made them "
        "(made before it kept one): its reuse rule found them in its output folder, put there by an earlier "
        "invocation or by something else, and the page cannot show which; only a rerun into a fresh `--out` makes "
        "them this command's: "
        + ", ".join(f"{name.replace('-r-', ' @ ')} on {task} ({when:%Y-%m-%d})" for when, name, task in earlier)
    ]


def layout_line(folder: Path) -> str:
    """What the runs compressed, from the arguments each nugget run recorded (a run from before ``wrapper`` existed
    compressed the template's opening with the document)."""
    from decodebench.reports.reader import read_text

    layouts = set()
    for results in (path for tasks in kept_runs(folder).values() for path in tasks.values()):
        info = json.loads(read_text(results))["config"]["decodebench"]
        if info["method"] == "nugget" and info["method_args"]["selector"] != "full":  # full compresses nothing
            layouts.add(info["method_args"].get("wrapper", "compressed"))
    if layouts == {"kept"}:
        return (
            "- as the authors run it (`wrapper=kept`): the chat template's opening (system turn, user header) is kept "
            "whole, the document (from there to the prompt's last blank line) keeps ceil(n / ratio) of its n tokens, "
            "and the question or instruction stays uncompressed"
        )
    if layouts == {"compressed"}:
        return (
            "- the chat template's opening and the document (everything before the prompt's last blank line) keep "
            "ceil(n / ratio) of their n tokens together (`wrapper=compressed`, the only layout when these runs were "
            "made; the authors compress the document alone, `wrapper=kept`, now the default: docs/nugget-kept.md "
            "measures what each layout keeps); the question or instruction stays uncompressed"
        )
    raise ValueError(f"{folder}: its nugget runs mix layouts ({sorted(layouts)}): rerun them with one")


def render(folder: Path) -> str:
    from decodebench.measure.machine import short_name
    from decodebench.metrics.kinds import is_binary_metric, metric_range
    from decodebench.stats import paired_comparison, quality_interval

    rows, ratios = read_rows(folder)
    run = load_json(folder, "run.json")
    checkpoints = load_json(folder, "checkpoints.json")
    full = rows[0]
    at_ratios = f"ratio{'s' if len(ratios) > 1 else ''} " + " and ".join(f"{r:g}" for r in ratios)
    kvpress = any(row.name.startswith("kvpress") for row in rows)
    title = f"the default against kvpress's presses at {at_ratios}" if kvpress else f"quality kept at {at_ratios}"
    lines = run_header(folder, f"Nugget study: {title}", "kvpress,nugget-study" if kvpress else "nugget-study")
    limits = {task: len(full.scores[task]) for task in TASKS if task in full.scores}
    lines += made_elsewhere(folder, run)
    trained_lines = []
    for ratio, manifest in sorted(checkpoints.items(), key=lambda item: float(item[0])):
        held = manifest["held_out_loss"]
        split = manifest["corpus_split"]
        trained_lines.append(
            f"  - ratio {ratio}: `{manifest['file']}` (sha256 {manifest['sha256'][:12]}...), `{manifest['command']}`: "
            f"{manifest['steps']} steps on {manifest['corpus']} ({split['trained_on']} documents; {split['held_out']} "
            f"held out; {split['dropped_for_sharing_text_with_evaluation_samples']} dropped for sharing text with the "
            f"evaluation samples), held-out loss {held[0][1]:.3f} -> {held[-1][1]:.3f}, trained on "
            f"{manifest['machine']}"
        )
    names = {row.name for row in rows}
    lines += [
        f"- model: the embedded SmolLM2-135M-Instruct, greedy, chat template, batch {run['quality_batch_size']} "
        "(greedy answers equal batch 1's: tests/test_nugget.py); tasks: squad_mini (real SQuAD v1.1 dev questions, "
        "the paper's normalized accuracy) and cnndm_mini (real CNN/DailyMail test articles in their original casing, "
        "ROUGE-Lsum)" + "".join(f", {task} n = {n}" for task, n in limits.items()),
        layout_line(folder),
        *(
            [
                "- `trained` is the paper's method as shipped (`selector=trained`): scorer on "
                "layer 3 + LoRA rank 32 encoder and decoder + soft token, straight-through estimator, zero-shot (plain "
                "text split into a part to compress and a part to continue), one checkpoint per ratio, "
                "models/nugget/weights/:",
                *trained_lines,
            ]
            if trained_lines  # the study read the shipped checkpoints: it ran them
            else []
        ),
        *span_scorer_lines(folder),
        *our_peers_lines(names),
        *(kvpress_lines(folder) if kvpress else []),
        "- interval: 95% (Wilson with continuity correction for accuracy, Student's t for ROUGE); vs full: paired on "
        "the same documents (McNemar exact for accuracy, the paired sign-flip permutation test for ROUGE, with the "
        "interval each implies); KV: the document's kept key/value bytes per row; TTFT: p50 over rows; peak memory: "
        "the task's largest window growth (resident memory on a CPU). TTFT and memory here come from batched runs "
        "that shared the machine: indicative only; the throughput section below measures speed properly",
        "",
    ]
    for task, (metric, metric_label) in TASKS.items():
        reference = full.scores.get(task, {})
        if not reference:
            continue
        kind = {"binary": is_binary_metric(metric), "bounds": metric_range(metric)}
        notes = []
        lines += [
            f"## {task} ({metric_label}, n = {len(reference)})",
            "",
            f"| selector | ratio | {metric_label} [95% CI] | share of full | vs full: difference [95% CI], p "
            "| achieved ratio | document KV / row (KiB) | TTFT p50 (s) | peak memory (MiB) | machine |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for row in rows:
            values = row.scores.get(task)
            if not values:
                continue
            shared = sorted(set(values) & set(reference))
            mean = statistics.mean(values.values())
            # a row on fewer documents (a press left some out) is set against full context on the same ones
            base = statistics.mean(reference[d] for d in shared)
            interval, _ = quality_interval(list(values.values()), **kind)
            if row is full:
                versus = "-"
            else:
                paired = paired_comparison([values[d] for d in shared], [reference[d] for d in shared], **kind)
                versus = (
                    f"{paired.difference:+.3f} [{paired.interval.low:+.3f}, {paired.interval.high:+.3f}], "
                    f"p = {paired.p_value:.3g}"
                )
            achieved = row.achieved.get(task)
            kv = row.kv_bytes.get(task)
            ttft = row.ttft.get(task)
            memory = row.peak_memory.get(task)
            name = row.name
            if left_out := row.left_out.get(task):
                name += f" (n = {len(values)})"
                notes.append(
                    f"- {row.name} @ {row.ratio:g} left out {len(left_out)} of {task}'s documents (doc_id "
                    f"{', '.join(map(str, left_out))}): {row.left_out_reason}. Its share of full and its comparisons "
                    f"are on the other {len(values)}."
                )
            if note := row.notes.get(task):
                notes.append(f"- {row.name} @ {row.ratio:g} {note}.")
            lines.append(
                f"| {name} | {f'{row.ratio:g}' if row.ratio else '1'} | {mean:.3f} "
                f"[{interval.low:.3f}, {interval.high:.3f}] | {mean / base:.0%} | {versus} "
                f"| {f'{achieved:.2f}' if achieved else '-'} | {f'{statistics.mean(kv) / 1024:.0f}' if kv else '-'} "
                f"| {f'{statistics.median(ttft):.3f}' if ttft else '-'} "
                f"| {f'{memory / 2**20:.0f}' if memory else '-'} "
                f"| {short_name(row.machines[task]) if task in row.machines else 'not recorded'} |"
            )
        lines += ["", *notes, *([""] if notes else [])]
    if not kvpress:
        lines += [
            "kvpress presses: not run this time (`--kvpress-python .tox/kvpress/bin/python` runs them; the previous "
            "study's kvpress rows, not recomputable, are in git history: docs/nugget-study.md before this page).",
            "",
        ]
    lines += against_default(rows, ratios) if kvpress else against_peers(rows, ratios)
    if kvpress:
        lines += cost_section(folder, rows, ratios)
    lines += training_curves(checkpoints)
    lines += span_scorer_curve(folder)
    if (folder / "throughput.json").is_file():
        lines += throughput_section(load_json(folder, "throughput.json"))
    lines += [
        "Paper anchors (LLaMA-2-7B-chat, zero-shot, trained on the Pile): SQuAD accuracy full 64.5, 5x 59.1 (92%), "
        "10x 49.8 (77%).",
        "",
        "How often each selector keeps the tokens of squad_mini's answers, and each one's accuracy where it kept "
        "and where it dropped them: docs/nugget-kept.md (`tox -e nugget-kept`). What an older compressor learned "
        "on its own objective (held-out continuation loss per selector): docs/nugget-objective.md.",
        "",
    ]
    return "\n".join(lines)


OUR_PEERS = {"scorer only", "delimiter", "salience", "question-overlap", "truncation", "streaming", "query-attention"}


def our_peers_lines(names: set[str]) -> list[str]:
    """What the page says of our training-free peers (none on a page that runs none of them)."""
    if not names & OUR_PEERS:
        return []
    return [
        (
            "- `scorer only` is the shipped scorer on the frozen model (an ablation); "
            if "scorer only" in names
            else "- "
        )
        + "`delimiter` is the training-free, query-independent stand-in; "
        + (
            "`salience` (names and numbers, then surprisal, whole words: query-independent, ours), "
            if "salience" in names
            else ""
        )
        + (
            "`question-overlap` (the sentences sharing most words with the question first, salience within them: "
            "query-aware, ours), "
            if "question-overlap" in names
            else ""
        )
        + "`query-attention` (query-aware, SnapKV's kin), `truncation` and `streaming` (StreamingLLM, 4 sinks) are "
        "the training-free peers"
    ]


DEFAULT = "answer-spans"  # --model nugget's default selector


def kvpress_lines(folder: Path) -> list[str]:
    """What the page says of kvpress's presses and how they ran (the decoding batch from their kept files)."""
    batches = {
        json.loads(path.read_text()).get("batch_size", 1)
        for path in (folder / "kvpress").glob("r*/*.json")
        if not path.name.endswith("-cost.json")
    }
    decoding = (
        "batch 1"
        if batches == {1}
        else f"each document compressed alone as the pipeline does, then {'/'.join(map(str, sorted(batches)))} "
        "documents decoded together by the pipeline's greedy rule (studies/kvpress_peers.py's `decode_together`; "
        "tests/kvpress_check.py: the same answers as the pipeline's one at a time, every press)"
    )
    return [
        "- kvpress 0.5.5's presses, in its own environment (`tox -e kvpress`: transformers<5.3), through kvpress's "
        "text-generation pipeline (chat template, greedy, the question after compression, the answer cut at the "
        f"task's stops), {decoding}, each compressing exactly the document as `--model nugget` does: the chat "
        "template's opening kept whole, ceil(n / ratio) of the document's n tokens kept, the question uncompressed "
        "(kvpress's `compression_ratio` set per document to drop the rest, the opening ranked above every document "
        "token; studies/kvpress_peers.py). Each press's defaults otherwise:",
        *(f"  - kvpress {name}: {what}" for name, what in PRESSES.items()),
        "- kvpress's KVzip ranks every layer's and head's pairs together (a layer may keep more than another) and "
        "masks the pairs it evicts instead of removing them (its authors' repository removes them): its KV column "
        "counts the pairs it keeps, and its budget, rounded over all layers and heads at once, keeps about half a "
        "token a row more than the others' (its achieved ratio)",
        "- kvpress's PyramidKV gives every layer the same budget unless its smallest layer's budget reaches its "
        "64-token window at beta 20 (a context keeping over 1280 tokens; tests/kvpress_check.py): on these documents "
        "it runs as SnapKV",
        "- as run here every press compresses the document before the question is seen, so one compressed "
        "document serves any question, as the default's does; SnapKV, PyramidKV and TOVA would read the question "
        "only if it were compressed with the document",
    ]


def paired_at(first: Row, second: Row, task: str):
    """``first`` minus ``second`` on ``task``, paired on the documents both ran."""
    from decodebench.metrics.kinds import is_binary_metric, metric_range
    from decodebench.stats import paired_comparison

    metric = TASKS[task][0]
    shared = sorted(set(first.scores[task]) & set(second.scores[task]))
    return paired_comparison(
        [first.scores[task][d] for d in shared],
        [second.scores[task][d] for d in shared],
        binary=is_binary_metric(metric),
        bounds=metric_range(metric),
    )


def against_default(rows: list[Row], ratios) -> list[str]:
    """The default against each kvpress press of the same ratio, and against the best query-agnostic one, said
    plainly."""
    lines = ["## The default against each press", ""]
    standing, beaten = [], {}  # beaten: {press: [(task, ratio)]} where the best query-agnostic press is ahead
    for task, (_, metric_label) in TASKS.items():
        for ratio in ratios:
            default = next((r for r in rows if r.name == DEFAULT and r.ratio == ratio and task in r.scores), None)
            presses = [r for r in rows if r.name.startswith("kvpress") and r.ratio == ratio and task in r.scores]
            if default is None or not presses:
                continue
            lines.append(f"- {task} at ratio {ratio:g} ({metric_label}, the default minus the press, paired):")
            for press in presses:
                paired = paired_at(default, press, task)
                lines.append(f"  - {DEFAULT} vs {press.name}: {comparison_text(paired, DEFAULT, press.name)}")
            agnostic = [r for r in presses if PRESSES[r.name.removeprefix("kvpress ")].startswith("query-agnostic")]
            best = max(agnostic, key=lambda r: statistics.mean(r.scores[task].values()))
            shared = sorted(set(default.scores[task]) & set(best.scores[task]))
            versus = paired_at(default, best, task)
            if versus.p_value < 0.05 and versus.difference < 0:
                beaten.setdefault(best.name, []).append(f"{task} at ratio {ratio:g}")
            standing.append(
                f"- {task} at ratio {ratio:g} ({metric_label}): the default "
                f"{statistics.mean(default.scores[task][d] for d in shared):.3f}, the best query-agnostic press "
                f"({best.name}) {statistics.mean(best.scores[task][d] for d in shared):.3f}; the default minus the "
                f"press {comparison_text(versus, DEFAULT, best.name)}"
            )
    following = [
        f"- **{press} beats the default** on {', '.join(where)}. The next step: its scores as a nugget selector "
        "(ranked once per position, kept in every layer, as `--model nugget` keeps positions: the hybrid), or "
        f"{press} itself as the default where it wins, its prefill cost (below) accepted"
        for press, where in beaten.items()
    ]
    chosen = (
        "The best query-agnostic press is the one with the highest mean on these documents; its p is not adjusted "
        "for that choice among the four."
    )
    return ["## Standing", "", chosen, "", *standing, *following, "", *lines, ""]


def comparison_text(paired, first: str, second: str) -> str:
    verdict = (
        "no significant difference"
        if paired.p_value >= 0.05
        else f"{first if paired.difference > 0 else second} is ahead"
    )
    return (
        f"{paired.difference:+.3f} [{paired.interval.low:+.3f}, {paired.interval.high:+.3f}], p = {paired.p_value:.3g} "
        f"({paired.test}, n = {paired.n}): {verdict}"
    )


def cost_section(folder: Path, rows: list[Row], ratios) -> list[str]:
    """What compressing costs: each compressor's prefill over the plain prefill of the same document (paired per
    document, the order rotating), the largest memory growth of a prefill, and the document KV a row keeps."""
    from decodebench.measure.machine import short_name
    from decodebench.stats import round_ratio_interval

    lines = [
        "## What compressing costs",
        "",
        "Prefill: the opening and the document through the model, compression included, over the plain prefill of "
        "the same tokens in the same process, per document (the order of the sides rotating from document to "
        "document, one discarded prefill of each side first); geometric mean with its 95% interval over documents. "
        "The default's ratio comes from decodebench's environment and the presses' from kvpress's (each against "
        "its own plain prefill). Peak growth: the largest memory growth of one prefill (resident memory on a "
        "CPU: it grows only past what the process already holds, so a dash means no growth). Document KV: what a "
        "row keeps of the document, from the quality runs. torch threads: "
        f"{load_json(folder, 'run.json')['machine'].get('torch_threads', 'not recorded')}.",
        "",
    ]
    study_machine = load_json(folder, "run.json")["machine"]
    order = {press: number for number, press in enumerate(PRESSES)}
    for ratio in ratios:
        sources = []  # (the name a side's row has, {task: {side: {doc_id: [seconds, peak]}}}, machine)
        if (folder / "default-cost" / f"r{ratio:g}.json").is_file():
            data = load_json(folder / "default-cost", f"r{ratio:g}.json")
            sources.append(("{}", data["by_task"], study_machine))
        for path in sorted((folder / "kvpress" / f"r{ratio:g}").glob("*-cost.json")):
            data = json.loads(path.read_text())
            sources.append(("kvpress {}", data["cost"]["by_task"], data["machine"]))
        for task in TASKS:
            table = []
            for naming, by_task, machine in sources:
                plain = by_task.get(task, {}).get("plain", {})
                for side, per_doc in sorted(by_task.get(task, {}).items(), key=lambda item: order.get(item[0], -1)):
                    if side == "plain":
                        continue
                    label = naming.format(side)
                    shared = sorted(set(per_doc) & set(plain), key=int)
                    interval = round_ratio_interval([per_doc[d][0] / plain[d][0] for d in shared])
                    middle = statistics.geometric_mean([per_doc[d][0] / plain[d][0] for d in shared])
                    peaks = [per_doc[d][1] for d in shared if per_doc[d][1]]
                    row = next((r for r in rows if r.name == label and r.ratio == ratio), None)
                    kv = row.kv_bytes.get(task) if row else None
                    table.append(
                        f"| {label} | {middle:.2f}x [{interval.low:.2f}, {interval.high:.2f}] | {len(shared)} "
                        f"| {statistics.median(per_doc[d][0] for d in shared):.3f} "
                        f"| {statistics.median(plain[d][0] for d in shared):.3f} "
                        f"| {f'{max(peaks) / 2**20:.0f}' if peaks else '-'} "
                        f"| {f'{statistics.mean(kv) / 1024:.0f}' if kv else '-'} | {short_name(machine)} |"
                    )
            if table:
                lines += [
                    f"### {task} at ratio {ratio:g}",
                    "",
                    "| compressor | prefill / plain prefill [95% CI] | documents | prefill p50 (s) | plain p50 (s) "
                    "| peak growth (MiB) | document KV / row (KiB) | machine |",
                    "|---|---:|---:|---:|---:|---:|---:|---|",
                    *table,
                    "",
                ]
    return lines


def against_peers(rows: list[Row], ratios) -> list[str]:
    """Every compressed row against every other of the same ratio, each pair once, paired on the documents both ran
    (the rows in the tables' order: the trained method first)."""
    from decodebench.metrics.kinds import is_binary_metric, metric_range
    from decodebench.stats import paired_comparison

    lines = ["## Each compressor against each peer", ""]
    for task, (metric, metric_label) in TASKS.items():
        kind = {"binary": is_binary_metric(metric), "bounds": metric_range(metric)}
        for ratio in ratios:
            at = [row for row in rows if row.ratio == ratio and task in row.scores]
            if len(at) < 2:
                continue
            lines.append(f"- {task} at ratio {ratio:g} ({metric_label}, the first minus the second, paired):")
            for number, first in enumerate(at):
                for second in at[number + 1 :]:
                    shared = sorted(set(first.scores[task]) & set(second.scores[task]))
                    paired = paired_comparison(
                        [first.scores[task][d] for d in shared], [second.scores[task][d] for d in shared], **kind
                    )
                    verdict = (
                        "no significant difference"
                        if paired.p_value >= 0.05
                        else f"{first.name} is {'ahead' if paired.difference > 0 else 'behind'}"
                    )
                    lines.append(
                        f"  - {first.name} vs {second.name}: {paired.difference:+.3f} [{paired.interval.low:+.3f}, "
                        f"{paired.interval.high:+.3f}], p = {paired.p_value:.3g} ({paired.test}, n = {paired.n}): "
                        f"{verdict}"
                    )
    return [*lines, ""]


def span_scorer_lines(folder: Path) -> list[str]:
    """What the page says of ``answer-spans``, from the manifest of the scorer the study ran (none: not run)."""
    if not (folder / "span_scorer.json").is_file():
        return []
    manifest = load_json(folder, "span_scorer.json")
    split, held = manifest["corpus_split"], manifest["held_out_loss"]
    return [
        "- `answer-spans` is ours, not the paper's method (issue 35): the paper's scorer (a feed-forward net over "
        f"layer {manifest['settings']['layer']} of the frozen model, through its final norm) trained with a dense "
        "loss toward the terms the dictionaries mark as cross-references and the names and numbers in them, whole "
        "predicted spans kept (each text once), the nuggets the frozen model's own states (no adapters), one scorer "
        f"for every ratio: `{manifest['file']}` (sha256 {manifest['sha256'][:12]}...), "
        f"`{common.shown_command(shlex.split(manifest['command']), drop=())}`: "
        f"{manifest['steps']} steps on {manifest['corpus']} ({split['trained_on']} documents; {split['held_out']} "
        f"held out; {split['dropped_for_sharing_text_with_evaluation_samples']} dropped for sharing text with the "
        f"evaluation samples), held-out binary cross-entropy {held[0][1]:.3f} -> {held[-1][1]:.3f}, trained on "
        f"{manifest['machine']}"
    ]


def span_scorer_curve(folder: Path) -> list[str]:
    """The answer-span scorer's held-out loss over its training (its manifest's record)."""
    if not (folder / "span_scorer.json").is_file():
        return []
    manifest = load_json(folder, "span_scorer.json")
    settings = manifest["settings"]
    lines = [
        "## How the answer-span scorer trained",
        "",
        "Held-out binary cross-entropy per document token (nats) on the same "
        f"{settings['held_out_windows']} held-out entries each time, by step: "
        f"{manifest['steps']} steps of {settings['accumulate']} entries, lr {settings['lr']:g}, weight decay "
        f"{settings['weight_decay']:g}, {manifest['training_seconds'] / 60:.0f} min on {manifest['machine']}.",
        "",
        "| step | held-out loss |",
        "|---:|---:|",
    ]
    lines += [f"| {step} | {loss:.4f} |" for step, loss in manifest["held_out_loss"]]
    return [*lines, ""]


def training_curves(checkpoints: dict) -> list[str]:
    """The held-out loss of each shipped checkpoint over its training (its manifest's record)."""
    if not checkpoints:
        return []
    ordered = sorted(checkpoints.items(), key=lambda item: float(item[0]))
    curves = {ratio: dict(manifest["held_out_loss"]) for ratio, manifest in ordered}
    steps = sorted({step for curve in curves.values() for step in curve})
    windows = ordered[0][1]["settings"]["held_out_windows"]
    lines = [
        "## How the shipped compressors trained",
        "",
        f"Held-out loss (mean cross-entropy per continuation token, nats, on the same {windows} windows of held-out "
        "documents each time) by training step, from each checkpoint's manifest: "
        + "; ".join(
            f"ratio {ratio}: {m['steps']} steps, lr {m['settings']['lr']:g}, {m['training_seconds'] / 3600:.1f} h on "
            f"{m['machine']}"
            for ratio, m in ordered
        )
        + ".",
        "",
        "| step | " + " | ".join(f"ratio {ratio}" for ratio in curves) + " |",
        "|---:|" + "---:|" * len(curves),
    ]
    for step in steps:
        cells = (f"{curve[step]:.3f}" if step in curve else "-" for curve in curves.values())
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def throughput_section(data: dict) -> list[str]:
    """Tokens/s of the trained method against full context at each batch size (paired per round), the KV each row
    holds, and the largest batch whose KV fits the budget."""
    from decodebench.stats import speed_ratio_interval

    runs = data["runs"]
    full_b1 = [r for r in runs if r["selector"] == "full" and r["batch"] == 1]
    # full context keeps every prompt token: its per-token KV is the cache's bytes over the prompt's tokens at batch 1
    bytes_per_token = sum(r["kv_bytes_at_decode_start"] for r in full_b1) / sum(r["prompt_tokens"] for r in full_b1)
    budget = data["kv_budget_mib"] * 2**20
    lines = [
        f"## Throughput by batch size ({data['task']}, {data['limit']} questions, {data['rounds']} rounds)",
        "",
        f"Full context and the trained method decode the same {data['limit']} questions at each batch size (at most "
        f"{data['max_gen_toks']} new tokens per row), in "
        "rounds whose order alternates (round and batch), one lm_eval process per run; tokens/s: new tokens over "
        "the summed generate time; the ratio to full context at the same batch is paired per round, with its 95% "
        f"interval over the {data['rounds']} rounds"
        + (
            f" (with {data['rounds']} rounds, a bootstrap interval is only the spread of {data['rounds']} paired "
            "ratios, not a calibrated 95% interval)"
            if data["rounds"] < 5
            else ""
        )
        + ". KV / row: what the batch's cache physically holds per row after "
        f"prefill (left padding included), plus the {data['max_gen_toks']} tokens a row may still add; largest "
        f"batch: how many such rows fit a {data['kv_budget_mib']} MiB KV budget. Peak memory: the run's largest "
        "window growth (resident memory).",
        "",
        "| batch | selector | ratio | tokens/s | vs full [95% CI] | KV / row at most (KiB) | largest batch in "
        f"{data['kv_budget_mib']} MiB | peak memory (MiB) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    sides = []
    for run in runs:
        if (run["selector"], run["ratio"]) not in sides:
            sides.append((run["selector"], run["ratio"]))
    for batch in data["batches"]:
        base = sorted((r for r in runs if r["batch"] == batch and r["selector"] == "full"), key=lambda r: r["round"])
        for name, ratio in sides:
            mine = sorted(
                (r for r in runs if r["batch"] == batch and (r["selector"], r["ratio"]) == (name, ratio)),
                key=lambda r: r["round"],
            )
            speed = sum(r["new_tokens"] for r in mine) / sum(r["seconds"] for r in mine)
            if name == "full":
                versus = "-"
            else:
                ratio_value, interval = speed_ratio_interval(
                    [r["new_tokens"] for r in mine],
                    [r["seconds"] for r in mine],
                    [r["new_tokens"] for r in base],
                    [r["seconds"] for r in base],
                )
                versus = f"{ratio_value:.2f}x" + (
                    f" [{interval.low:.2f}, {interval.high:.2f}]" if len(mine) > 1 else ""
                )
            per_row = max(r["kv_bytes_at_decode_start"] / r["requests"] for r in mine)
            per_row += data["max_gen_toks"] * bytes_per_token
            memory = max(r["peak_memory_bytes"] or 0 for r in mine)
            lines.append(
                f"| {batch} | {name} | {f'{ratio:g}' if ratio else '1'} | {speed:.1f} | {versus} | "
                f"{per_row / 1024:.0f} | {math.floor(budget / per_row)} | {memory / 2**20:.0f} |"
            )
    return [*lines, ""]


def task_limits(text: str) -> dict[str, int | None]:
    """``--limit``: one number for every task, or ``task=N`` pairs (tasks not named run whole)."""
    limits: dict[str, int | None] = dict.fromkeys(TASKS)
    for part in filter(None, (p.strip() for p in text.split(","))):
        task, _, number = part.rpartition("=")
        if task and task not in TASKS:
            raise argparse.ArgumentTypeError(f"unknown task {task!r}; the study's tasks are {', '.join(TASKS)}")
        if not number.isdigit() or int(number) < 1:
            raise argparse.ArgumentTypeError(f"a limit must be a positive integer, got {number!r}")
        for name in [task] if task else TASKS:
            limits[name] = int(number)
    return limits


def numbers(kind):
    def parse(text: str):
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
        return values

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/nugget-study.md")
    parser.add_argument("--ratios", type=numbers(float), default=[5.0, 10.0], help="compression ratios (5,10)")
    parser.add_argument(
        "--out",
        default=str(common.REPO / "results" / "nugget-study"),
        help=(
            "lm_eval output folder (finished quality runs are reused while the method's code and weights are "
            "unchanged; study commands sharing one run side by side and make each run once; default "
            "results/nugget-study)"
        ),
    )
    parser.add_argument(
        "--limit",
        type=task_limits,
        default=task_limits(""),
        help="documents per task: N for both, or squad_mini=N,cnndm_mini=M (default: all)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="batch size of the quality runs (default 8)")
    parser.add_argument(
        "--wrapper",
        choices=("kept", "compressed"),
        default="kept",
        help="what comes before the document: kept whole (the authors' layout, the default) or compressed with it",
    )
    parser.add_argument("--kvpress-python", default=None, help="python of an environment with kvpress")
    parser.add_argument(
        "--presses",
        default=",".join(PRESSES),
        help="kvpress presses to run with --kvpress-python, comma-separated (default: all of "
        + ", ".join(PRESSES)
        + ")",
    )
    parser.add_argument(
        "--cost-limit",
        type=task_limits,
        default=task_limits("squad_mini=50,cnndm_mini=20"),
        help="documents per task whose prefill cost is timed with --kvpress-python (squad_mini=50,cnndm_mini=20)",
    )
    parser.add_argument(
        "--kvpress-batch-size",
        type=int,
        default=16,
        help="documents a kvpress run decodes together, each compressed alone (default 16; 1: kvpress's pipeline "
        "call, one at a time)",
    )
    parser.add_argument(
        "--kvpress-jobs", type=int, default=2, help="kvpress quality runs side by side, sharing the cores (default 2)"
    )
    parser.add_argument(
        "--selectors",
        default=",".join(OURS),
        help="rows besides full context, comma-separated (default: all of " + ", ".join(OURS) + ")",
    )
    parser.add_argument("--batches", type=numbers(int), default=[1, 8, 32], help="throughput batch sizes (1,8,32)")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (default 3; 0: no throughput)")
    parser.add_argument("--throughput-limit", type=int, default=32, help="squad_mini questions per throughput run (32)")
    parser.add_argument("--throughput-max-gen-toks", type=int, default=32, help="new tokens per row there (32)")
    parser.add_argument("--throughput-ratio", type=float, default=10.0, help="the trained method's ratio there (10)")
    parser.add_argument("--kv-budget-mib", type=int, default=512, help="the KV budget of the largest batch (512)")
    args = parser.parse_args(argv)
    args.selectors = tuple(s.strip() for s in args.selectors.split(",") if s.strip())
    if unknown := sorted(set(args.selectors) - set(OURS)):
        parser.error(f"unknown selectors {unknown}; choose from {', '.join(OURS)}")
    if unknown := sorted({p.strip() for p in args.presses.split(",") if p.strip()} - set(PRESSES)):
        parser.error(f"unknown presses {unknown}; choose from {', '.join(PRESSES)}")
    if args.kvpress_batch_size < 1:
        parser.error(f"--kvpress-batch-size must be at least 1, got {args.kvpress_batch_size}")
    if args.kvpress_jobs < 1:
        parser.error(f"--kvpress-jobs must be at least 1, got {args.kvpress_jobs}")
    return page(args, argv, lambda folder, command: collect(folder, command, args), render)


if __name__ == "__main__":
    sys.exit(main())
