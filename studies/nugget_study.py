"""The nugget study: how much quality a context kept as 1/ratio of its tokens retains.

``tox -e kvpress,nugget-study`` (``python studies/nugget_study.py``) runs ``lm_eval --model nugget``
at ``ratio`` (10) on squad_mini and cnndm_mini with the embedded model for every selector: full
context, the paper's learned scorer (trained first with ``train-nugget`` if no selector file is
given), the two training-free approximations (delimiter, attention), and the peers truncation and StreamingLLM; with
``--kvpress-python`` it also runs kvpress's SnapKV and observed-attention presses at the same
ratio in that interpreter (kvpress needs transformers<5.3, so it lives in its own environment,
``tox -e kvpress``). It writes a Markdown table to docs/nugget-study.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from common import doc_parser, task_docs, write_doc

from decodebench.measure.machine import short_name
from decodebench.models.nugget import NuggetConfig
from decodebench.runs import LmEvalRun, offline_env

TASKS = {"squad_mini": "normalized_accuracy,none", "cnndm_mini": "rougeL,none"}
SELECTORS = ["full", "learned", "delimiter", "attention", "truncation", "streaming"]


def default_selector_path(ratio: float) -> Path:
    from decodebench.paths import home

    return home() / "selectors" / f"nugget-embedded-r{ratio:g}.pt"


def run_study(
    out: str | Path = "results/nugget-study",
    doc: str | Path = "docs/nugget-study.md",
    ratio: float = NuggetConfig.defaults().ratio,
    limit: int | None = None,
    selector_file: str | None = None,
    kvpress_python: str | None = None,
) -> int:
    from decodebench.embedded import ensure_embedded_model

    out = Path(out).resolve()
    started = time.time()
    checkpoint = str(ensure_embedded_model(log=print))
    learned = Path(selector_file) if selector_file else default_selector_path(ratio)
    if not learned.is_file():
        from decodebench.models.nugget.training import train

        print(f"training the nugget selector at ratio {ratio:g} -> {learned}", flush=True)
        train(checkpoint, learned, ratio=ratio)
    rows = []
    for number, selector in enumerate(SELECTORS, 1):
        run = LmEvalRun(
            model="nugget",
            model_args={
                "pretrained": "embedded",
                "selector": learned if selector == "learned" else selector,
                "ratio": f"{ratio:g}",
            },
            tasks=list(TASKS),
            output_path=out / selector,
            limit=limit,
        )
        print(f"\n[{number}/{len(SELECTORS)}] {selector}: {run.shown()}", flush=True)
        results = run.run()
        if results is None:
            print(f"{selector} FAILED", file=sys.stderr)
            return 1
        rows.append((selector, json.loads(results.read_text())))
    peers = {}
    if kvpress_python:
        items_file, peers_file = out / "kvpress-items.json", out / "kvpress.json"
        items_file.write_text(json.dumps(kvpress_items(limit)))
        command = [
            kvpress_python,
            str(Path(__file__).with_name("kvpress_peers.py")),
            *("--checkpoint", checkpoint, "--ratio", str(ratio), "--items", str(items_file), "--out", str(peers_file)),
        ]
        print(f"\nkvpress peers: {' '.join(command)}", flush=True)
        if subprocess.call(command, env=offline_env()) == 0:
            peers = json.loads(peers_file.read_text())
        else:
            peers = {"error": "the kvpress run failed; see its output above"}
    text = table(rows, peers, ratio, limit, time.time() - started)
    return write_doc(doc, text)


def kvpress_items(limit: int | None) -> list[dict]:
    """Each document of the study's tasks split as ``--model nugget`` splits it (the task's own prompt)."""
    split = NuggetConfig.defaults().split
    items = []
    for name in TASKS:
        task, docs = task_docs(name, limit)
        generation = task.config.generation_kwargs
        for doc in docs:
            document, _, question = task.doc_to_text(doc).rpartition(split)
            references = doc["answers"]["text"] if "answers" in doc else [task.doc_to_target(doc)]
            items.append(
                {
                    "task": name,
                    "document": document,
                    "question": split + question,
                    "max_new": generation["max_gen_toks"],
                    "stop": [s for s in generation.get("until", []) if s],
                    "references": references,
                }
            )
    return items


def table(rows, peers: dict, ratio: float, limit, seconds: float) -> str:
    full = rows[0][1]["results"]
    info = rows[0][1]["config"]["decodebench"]
    lines = [
        f"# Nugget study: quality kept at ratio {ratio:g} on the embedded model",
        "",
        f"Written by `python studies/nugget_study.py` on {datetime.now(UTC):%Y-%m-%d} ({seconds / 60:.0f} min), "
        f"machine: {short_name(info['machine'])}.",
        "",
        f"- model: the embedded SmolLM2-135M-Instruct, greedy, chat template; tasks: squad_mini "
        f"({full['squad_mini']['sample_len']} questions, the nugget paper's normalized accuracy) and cnndm_mini "
        f"({full['cnndm_mini']['sample_len']} articles, ROUGE-L)" + (f", --limit {limit}" if limit else ""),
        "- the document (before the prompt's last blank line) keeps ceil(n / ratio) tokens; the question or "
        "instruction stays uncompressed",
        "- `delimiter` and `attention` are training-free approximations of the paper's learned selector; "
        "`learned` is the paper's scorer trained here on a CPU for a few minutes (decodebench train-nugget), "
        "without the paper's LoRA adapters",
        "",
        "| selector | squad_mini accuracy | vs full | cnndm_mini ROUGE-L | vs full | achieved ratio "
        "| document KV kept | TTFT (s) | tokens/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for selector, results in rows:
        scores = results["results"]
        tasks = results["config"]["decodebench"]["tasks"]
        squad, rouge = scores["squad_mini"][TASKS["squad_mini"]], scores["cnndm_mini"][TASKS["cnndm_mini"]]
        method = tasks["squad_mini"]["method"]
        achieved = method.get("achieved_ratio")
        kept = method.get("document_kv_fraction_kept")
        ttft = sum(tasks[t]["mean_ttft_s"] * tasks[t]["requests"] for t in TASKS) / sum(
            tasks[t]["requests"] for t in TASKS
        )
        tps = sum(tasks[t]["new_tokens"] for t in TASKS) / sum(tasks[t]["generate_seconds"] for t in TASKS)
        lines.append(
            f"| {selector} | {squad:.3f} | {_share(squad, full['squad_mini'][TASKS['squad_mini']])} | {rouge:.3f} "
            f"| {_share(rouge, full['cnndm_mini'][TASKS['cnndm_mini']])} | {f'{achieved:.2f}' if achieved else '1'} "
            f"| {f'{kept:.3f}' if kept else '1'} | {ttft:.2f} | {tps:.1f} |"
        )
    if "error" in peers:
        lines.append(f"| kvpress presses | {peers['error']} | | | | | | | |")
    for press, scores in peers.items():
        if press == "error":
            continue
        squad, rouge = scores["squad_mini"], scores["cnndm_mini"]
        lines.append(
            f"| kvpress {press} | {squad:.3f} | {_share(squad, full['squad_mini'][TASKS['squad_mini']])} "
            f"| {rouge:.3f} | {_share(rouge, full['cnndm_mini'][TASKS['cnndm_mini']])} | {ratio:g} (press) "
            "| - | - | - |"
        )
    if not peers:
        lines.append("| kvpress presses | not run (pass --kvpress-python, see `tox -e nugget-study`) | | | | | | | |")
    lines += [
        "",
        f"Paper anchors (LLaMA-7B, trained): SQuAD accuracy full 64.5, 5x 59.1, 10x 49.8 (77% of full at 10x). "
        f"Goal here: at ratio {ratio:g}, at least 70% of the full-context squad_mini score with the best selector, "
        "above StreamingLLM, with document KV within 15% of full/ratio.",
        "",
    ]
    return "\n".join(lines)


def _share(value: float, reference: float) -> str:
    return f"{value / reference:.0%}" if reference else "-"


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/nugget-study.md")
    parser.add_argument("--ratio", type=float, default=NuggetConfig.defaults().ratio, help="compression ratio")
    parser.add_argument("--out", default="results/nugget-study", help="lm_eval output folder")
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--selector-file", default=None, help="a trained selector (default: train one)")
    parser.add_argument("--kvpress-python", default=None, help="python of an environment with kvpress")
    args = parser.parse_args(argv)
    return run_study(args.out, args.doc, args.ratio, args.limit, args.selector_file, args.kvpress_python)


if __name__ == "__main__":
    raise SystemExit(main())
