"""The nugget study: how much quality a document kept as 1/ratio of its tokens retains, on real data.

``tox -e kvpress,nugget-study`` (``python studies/nugget_study.py``) runs ``lm_eval --model nugget``
with the embedded model on squad_mini (500 real SQuAD v1.1 dev questions) and cnndm_mini (100
real CNN/DailyMail test articles) at each ratio (5 and 10): full context once, then the paper's
method (a ``decodebench train-nugget`` checkpoint: scorer + LoRA encoder/decoder + soft token,
trained first if none is given), its scorer alone on the frozen model, the training-free
delimiter stand-in, and the peers truncation, StreamingLLM and query-aware attention (SnapKV's
kin); with ``--kvpress-python`` also kvpress's SnapKV, observed-attention and StreamingLLM presses
on the same documents in that interpreter (kvpress needs transformers<5.3: ``tox -e kvpress``).

For every row: the score with its 95% interval (Wilson for 0/1 accuracy, bootstrap for ROUGE),
the share of full context's score, the paired difference against full context on the same
documents (McNemar's exact test for accuracy, paired bootstrap for ROUGE), the compression
achieved, the document's KV bytes per row, time to first token (p50) and peak memory. It writes
docs/nugget-study.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from common import doc_parser, task_docs, write_doc
from kvpress_peers import PRESSES

from decodebench.runs import LmEvalRun, offline_env

TASKS = {"squad_mini": ("normalized_accuracy", "accuracy"), "cnndm_mini": ("rougeLsum", "ROUGE-Lsum")}
OURS = ("trained", "scorer only", "delimiter", "truncation", "streaming", "query-attention")


def selector_args(selector: str, checkpoint: Path) -> dict[str, str]:
    if selector == "trained":
        return {"selector": str(checkpoint)}
    if selector == "scorer only":
        return {"selector": str(checkpoint), "adapters": "false"}
    return {"selector": selector}


class Row:
    """One (selector, ratio) run, read back per document."""

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
        self.outputs: dict[str, dict[int, str]] = {}  # per task: doc_id -> the generation lm_eval scored
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
                if "machine" in values:  # measured by kvpress_peers.py's first-token pass
                    self.machines[task] = values["machine"]
                    self.ttft[task], self.kv_bytes[task] = values["ttft_s"], values["document_kv_bytes"]
                    self.peak_memory[task] = values["peak_memory_bytes"]

    def _read_lm_eval(self, path: Path) -> None:
        from decodebench.reports.reader import read_run

        run = read_run(path)
        machine = json.loads(path.read_text())["config"]["decodebench"]["machine"]
        for task, (metric, _) in TASKS.items():
            result = run.tasks.get(task)
            if result is None:
                continue
            self.machines[task] = machine
            self.scores[task] = {key[0]: value for key, value in result.per_document.get(metric, {}).items()}
            summary = result.measurement or {}
            self.achieved[task] = (summary.get("method") or {}).get("achieved_ratio")
            self.peak_memory[task] = summary.get("peak_memory_bytes")
            ttft, kv, outputs = [], [], {}
            for line in result.samples_file.read_text().splitlines():
                sample = json.loads(line)
                outputs[sample["doc_id"]] = sample["filtered_resps"][0]
                for record in sample.get("decodebench", []):
                    if record.get("ttft_s") is not None:
                        ttft.append(record["ttft_s"])
                    stats = record.get("method_stats", {})
                    kv.append(stats.get("document_kv_bytes_kept", stats.get("kv_bytes_at_decode_start", 0)))
            self.ttft[task], self.kv_bytes[task], self.outputs[task] = ttft, kv, outputs


def run_lm_eval(
    out: Path, name: str, ratio: float | None, args: dict, limits: dict[str, int | None], missing: list | None = None
) -> Row:
    """One lm_eval run per task, so that each task can have its own --limit. With a ``missing`` list,
    nothing new runs: a run not found is named there and its row left out of that task's table."""
    label = f"{name}" + (f" @ {ratio:g}" if ratio else "")
    paths = []
    for task, limit in limits.items():
        folder = out / label.replace(" ", "-").replace("@", "r") / f"{task}-limit{limit or 'all'}"
        existing = sorted(folder.glob("**/results_*.json"))
        if existing:  # a rerun of the study reuses finished runs (delete the folder to redo one)
            print(f"{label}, {task}: reusing {existing[-1]}", flush=True)
            paths.append(existing[-1])
            continue
        if missing is not None:
            missing.append(f"{label} on {task}")
            continue
        run = LmEvalRun(
            model="nugget",
            model_args={"pretrained": "embedded", **args, **({"ratio": f"{ratio:g}"} if ratio else {})},
            tasks=[task],
            output_path=folder,
            limit=limit,
        )
        paths.append(run.run_or_raise(f"{label}, {task}"))
    return Row(name, ratio, paths)


def kvpress_rows(out: Path, kvpress_python: str, checkpoint: str, ratio: float, limits, missing=None) -> list[Row]:
    """kvpress's presses at ``ratio``: one kvpress process per task, its file named by the task and its limit so
    that a rerun with other limits never reuses it. A press that cannot apply to some documents runs on the
    others; its row names those left out and kvpress's reason."""
    per_press: dict[str, dict] = {}
    reasons: dict[str, str] = {}
    for task, limit in limits.items():
        peers_file = out / f"kvpress-r{ratio:g}" / f"{task}-limit{limit or 'all'}.json"
        if not peers_file.is_file():
            if missing is not None:  # --reuse-only
                missing.append(f"kvpress presses @ {ratio:g} on {task}")
                continue
            items_file = peers_file.with_suffix(".items.json")
            items_file.parent.mkdir(parents=True, exist_ok=True)
            items_file.write_text(json.dumps(kvpress_items({task: limit})))
            command = [
                *(kvpress_python, str(Path(__file__).with_name("kvpress_peers.py")), "--skip-refused"),
                *("--checkpoint", checkpoint, "--ratio", str(ratio), "--items", str(items_file)),
                *("--out", str(peers_file)),
            ]
            print(f"\nkvpress presses @ {ratio:g} on {task}: {' '.join(command)}", flush=True)
            if subprocess.call(command, env=offline_env()) != 0:
                raise SystemExit("the kvpress run failed; see its output above")
        peers = json.loads(peers_file.read_text())
        for press in PRESSES:
            if press in peers:
                per_press.setdefault(press, {}).update(peers[press])
                if press in peers.get("left_out", {}):
                    reasons[press] = peers["left_out"][press]
            elif missing is not None:
                missing.append(f"kvpress {press} @ {ratio:g} on {task} (not in {peers_file.name})")
    return [
        Row(f"kvpress {press}", ratio, press=per_press[press], left_out_reason=reasons.get(press))
        for press in PRESSES
        if press in per_press
    ]


def kvpress_items(limits: dict[str, int | None]) -> list[dict]:
    """Each document of the study's tasks split as ``--model nugget`` splits it (the task's own prompt)."""
    from decodebench.models.nugget import NuggetConfig

    split = NuggetConfig.defaults().split
    items = []
    for name, limit in limits.items():
        task, docs = task_docs(name, limit)
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


def run_study(
    out: str | Path,
    doc: str | Path,
    ratios: list[float],
    limits: dict[str, int | None],
    checkpoint: str | None,
    kvpress_python: str | None,
    corpus: str | None,
    selectors: tuple[str, ...] = OURS,
    reuse_only: bool = False,
    cross_check: str | None = None,
) -> int:
    from decodebench.embedded import ensure_embedded_model
    from decodebench.models.nugget.checkpoint import read_checkpoint
    from decodebench.models.nugget.training import default_checkpoint, train

    out = Path(out).resolve()
    started = time.time()
    model_path = str(ensure_embedded_model(log=print))
    trained = Path(checkpoint) if checkpoint else default_checkpoint("embedded", 10)
    if not trained.is_file():
        print(f"training the nugget compressor -> {trained}", flush=True)
        train(model_path, trained, corpus=corpus)
    training = read_checkpoint(trained).training
    missing: list[str] | None = [] if reuse_only else None
    rows = [run_lm_eval(out, "full", None, {"selector": "full"}, limits, missing)]
    for ratio in ratios:
        for name in selectors:
            rows.append(run_lm_eval(out, name, ratio, selector_args(name, trained), limits, missing))
        if kvpress_python:
            rows += kvpress_rows(out, kvpress_python, model_path, ratio, limits, missing)
    text = report(rows, ratios, limits, training, trained, time.time() - started, bool(kvpress_python))
    if cross_check:
        text += "\n" + "\n".join(across_machines(rows, Path(cross_check).resolve(), limits)) + "\n"
    if skipped := [name for name in OURS if name not in selectors]:
        text += f"Rows not run this time (--selectors): {', '.join(skipped)}.\n"
    if missing:
        text += f"Runs not found and left out (--reuse-only): {', '.join(missing)}.\n"

    return write_doc(doc, text)


def report(rows: list[Row], ratios, limits, training: dict, checkpoint: Path, seconds: float, kvpress: bool) -> str:
    from decodebench.measure.machine import short_name
    from decodebench.stats import paired_comparison, quality_interval

    full = rows[0]
    held = training.get("held_out") or [[0, float("nan")]]
    settings = training.get("settings", {})
    lines = [
        f"# Nugget study: quality kept at ratio{'s' if len(ratios) > 1 else ''} "
        + " and ".join(f"{r:g}" for r in ratios)
        + " on the embedded model",
        "",
        f"Written by `python studies/nugget_study.py{''.join(' ' + a for a in sys.argv[1:])}` "
        "(`tox -e kvpress,nugget-study`) on "
        f"{datetime.now(UTC):%Y-%m-%d} ({seconds / 60:.0f} min of new runs), machines of the runs: "
        f"{'; '.join(sorted({short_name(m) for row in rows for m in row.machines.values()}))} (each row's in its "
        "table).",
        "",
        "- model: the embedded SmolLM2-135M-Instruct, greedy, chat template, batch 1; tasks: squad_mini (real SQuAD "
        "v1.1 dev questions, the paper's normalized accuracy) and cnndm_mini (real CNN/DailyMail test articles in "
        "their original casing, ROUGE-Lsum)"
        + "".join(f", {task} --limit {limit}" for task, limit in limits.items() if limit),
        "- the document (before the prompt's last blank line) keeps ceil(n / ratio) tokens; the question or "
        "instruction stays uncompressed",
        f"- `trained` is the paper's method: `decodebench train-nugget` checkpoint `{checkpoint.name}` (scorer on "
        f"layer {settings.get('layer', 3)} + LoRA rank {settings.get('rank', 32)} encoder and decoder + soft token, "
        f"straight-through estimator), {training.get('steps_done', '?')} steps at ratio {settings.get('ratio', '?')} "
        f"on {training.get('corpus', '?')} ({training.get('dropped_documents', '?')} documents dropped for sharing "
        f"text with the evaluation samples); held-out loss {held[0][1]:.3f} -> {held[-1][1]:.3f}. The same "
        "checkpoint runs at every ratio. `scorer only` is its scorer on the frozen model (an ablation); `delimiter` is "
        "the training-free, query-independent stand-in; `query-attention` (query-aware, SnapKV's kin), "
        "`truncation` and `streaming` (StreamingLLM, 4 sinks) are peers",
        "- interval: 95% (Wilson for accuracy, bootstrap for ROUGE); vs full: paired on the same documents "
        "(McNemar exact for accuracy, paired bootstrap for ROUGE); KV: the document's kept key/value bytes per row; "
        "TTFT: p50 over rows; peak memory: the task's largest window growth (resident memory on a CPU, the CUDA "
        "allocator's peak on a GPU). TTFT and memory come from runs that shared their machine with other rows: "
        "indicative only, and not comparable across machines; the scores are comparable (see Across machines)",
        "- kvpress rows: kvpress's own text-generation pipeline (chat template, greedy), the press compressing the "
        "prompt's document with its template header, as `--model nugget` does; their KV, TTFT and memory come from "
        "a second pass of the same press on each document that stops at the first answer token (the KV read from "
        "the compressed cache), since the scored pass is kvpress's pipeline untouched",
        "",
    ]
    for task, (_, label) in TASKS.items():
        reference = full.scores.get(task, {})
        if not reference:
            continue
        notes = []
        lines += [
            f"## {task} ({label}, n = {len(reference)})",
            "",
            f"| selector | ratio | {label} [95% CI] | share of full | vs full: difference [95% CI], p "
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
            interval, _ = quality_interval(list(values.values()))
            if row is full:
                versus = "-"
            else:
                paired = paired_comparison([values[d] for d in shared], [reference[d] for d in shared])
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
        lines += ["kvpress presses: not run (pass --kvpress-python; `tox -e kvpress,nugget-study` does).", ""]
    lines += goals(rows, full, ratios)
    lines += [
        "Paper anchors (LLaMA-2-7B-chat, zero-shot, trained on the Pile): SQuAD accuracy full 64.5, 5x 59.1 (92%), "
        "10x 49.8 (77%).",
        "",
        "What the compressor learned, on its own training objective (held-out continuation loss per selector) and "
        "on where squad_mini's answers lie among the kept tokens: docs/nugget-objective.md (`tox -e "
        "nugget-objective`).",
        "",
    ]
    return "\n".join(lines)


def across_machines(rows: list[Row], other_out: Path, limits: dict[str, int | None]) -> list[str]:
    """The same runs repeated on another machine (finished runs under ``other_out``): do they generate the
    same text? Greedy decoding can differ with a backend's numerics; the study mixes machines only if not."""
    from decodebench.measure.machine import short_name

    lines = ["## Across machines", "", f"The same runs repeated under `{other_out.name}`, document by document:", ""]
    for row in (row for row in rows if row.outputs):  # kvpress rows keep scores only
        other = run_lm_eval(other_out, row.name, row.ratio, {}, limits, missing=[])
        for task, outputs in row.outputs.items():
            repeated = other.outputs.get(task)
            if not repeated or short_name(other.machines[task]) == short_name(row.machines[task]):
                continue
            shared = sorted(set(outputs) & set(repeated))
            identical = sum(outputs[d] == repeated[d] for d in shared)
            mean, again = (statistics.mean(r.scores[task][d] for d in shared) for r in (row, other))
            lines.append(
                f"- {row.name}{f' @ {row.ratio:g}' if row.ratio else ''} on {task}: {identical} / {len(shared)} "
                f"generations identical between {short_name(row.machines[task])} and "
                f"{short_name(other.machines[task])} (score {mean:.3f} vs {again:.3f})"
            )
    return [*lines, ""] if len(lines) > 4 else [*lines, "- no run was repeated on another machine", ""]


def goals(rows: list[Row], full: Row, ratios) -> list[str]:
    """The issue's acceptance goal at ratio 10 on SQuAD: >= 70% of full, and above StreamingLLM, paired."""
    from decodebench.stats import paired_comparison

    if 10 not in ratios:
        return []
    task = "squad_mini"
    at10 = {row.name: row for row in rows if row.ratio == 10 and task in row.scores}
    trained, reference = at10.get("trained"), full.scores.get(task)
    if trained is None or not reference:
        return []
    share = statistics.mean(trained.scores[task].values()) / statistics.mean(reference.values())
    lines = [
        "## Goal at ratio 10 (squad_mini)",
        "",
        f"- the trained nugget keeps {share:.0%} of full context's accuracy (goal: at least 70%): "
        + ("met" if share >= 0.7 else "not met"),
    ]
    # StreamingLLM is the goal's peer; the other rows of the same budget, paired the same way, show what the
    # adapters add (scorer only is the method without them) and where the method stands
    goal_peers = [name for name in ("streaming", "kvpress StreamingLLM") if name in at10]
    others = [name for name in at10 if name not in ("trained", *goal_peers)]
    for peer in goal_peers + others:
        shared = sorted(set(trained.scores[task]) & set(at10[peer].scores[task]))
        paired = paired_comparison(
            [trained.scores[task][d] for d in shared], [at10[peer].scores[task][d] for d in shared]
        )
        verdict = (
            "beats it"
            if paired.interval.low > 0
            else "is beaten by it"
            if paired.interval.high < 0
            else "no clear difference"
        )
        lines.append(
            f"- trained vs {peer}{' (the goal)' if peer in goal_peers else ''}: {paired.difference:+.3f} "
            f"[{paired.interval.low:+.3f}, {paired.interval.high:+.3f}], p = {paired.p_value:.3g} ({paired.test}, "
            f"n = {paired.n}): {verdict}"
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


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/nugget-study.md")
    parser.add_argument("--ratios", default="5,10", help="compression ratios, comma-separated (default 5,10)")
    parser.add_argument(
        "--out", default="results/nugget-study", help="lm_eval output folder (finished runs are reused)"
    )
    parser.add_argument(
        "--limit",
        type=task_limits,
        default=task_limits(""),
        help="documents per task: N for both, or squad_mini=N,cnndm_mini=M (default: all)",
    )
    parser.add_argument(
        "--checkpoint", default=None, help="a train-nugget checkpoint (default: the default one, trained if missing)"
    )
    parser.add_argument("--corpus", default=None, help="training text when a checkpoint must be trained first")
    parser.add_argument("--kvpress-python", default=None, help="python of an environment with kvpress")
    parser.add_argument(
        "--selectors",
        default=",".join(OURS),
        help="rows besides full context, comma-separated (default: all of " + ", ".join(OURS) + ")",
    )
    parser.add_argument(
        "--reuse-only",
        action="store_true",
        help="start no new lm_eval run: write the document from the finished runs under --out, naming those missing",
    )
    parser.add_argument(
        "--cross-check",
        default=None,
        help="a second --out folder with some of the same runs made on another machine: the document says how many "
        "generations agree",
    )
    args = parser.parse_args(argv)
    ratios = [float(r) for r in args.ratios.split(",")]
    selectors = tuple(s.strip() for s in args.selectors.split(",") if s.strip())
    if unknown := sorted(set(selectors) - set(OURS)):
        parser.error(f"unknown selectors {unknown}; choose from {', '.join(OURS)}")
    return run_study(
        args.out,
        args.doc,
        ratios,
        args.limit,
        args.checkpoint,
        args.kvpress_python,
        args.corpus,
        selectors,
        args.reuse_only,
        args.cross_check,
    )


if __name__ == "__main__":
    sys.exit(main())
