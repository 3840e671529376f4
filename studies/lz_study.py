"""The LZ penalty study: does it cut degenerate repetition without lowering task scores?

``tox -e lz-study`` (``python studies/lz_study.py``) runs the real ``lm_eval`` command once per penalty setting on the
embedded model, greedy, over ``aime_mini`` (the 60 real AIME 2024 and 2025 problems, with up
to 1024 new tokens of chain of thought), and writes a Markdown table of task score, degenerate-repetition
rate, generation length and speed (docs/lz-study.md). The settings follow the paper's
comparison (section 4 and its appendix sweeps): no penalty, a frequency-penalty sweep, the
repetition penalty at 1.1/1.2/1.3, and the LZ penalty at its default 0.15.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from common import doc_parser, write_doc

from decodebench.measure.machine import short_name
from decodebench.models.lz import LZConfig
from decodebench.runs import LmEvalRun


@dataclass(frozen=True)
class Setting:
    name: str
    penalty: str
    strength: float | None = None

    @property
    def model_args(self) -> dict[str, object]:
        return (
            {"penalty": self.penalty} if self.strength is None else {"penalty": self.penalty, "strength": self.strength}
        )


SETTINGS = [
    Setting("none", "none"),
    Setting("frequency 0.1", "frequency", 0.1),
    Setting("frequency 0.3", "frequency", 0.3),
    Setting("frequency 0.6", "frequency", 0.6),
    Setting("frequency 1.0", "frequency", 1.0),
    Setting("repetition 1.1", "repetition", 1.1),
    Setting("repetition 1.2", "repetition", 1.2),
    Setting("repetition 1.3", "repetition", 1.3),
    Setting(f"lz {LZConfig.defaults().strength:g}", "lz"),
]
TASK = "aime_mini"
# Engine settings for vLLM on a CPU: a small memory share, and eager mode (no ~45 s compile).
VLLM_ARGS = {"gpu_memory_utilization": 0.3, "max_model_len": 2048, "enforce_eager": True}


def run_study(
    out: str | Path = "results/lz-study",
    doc: str | Path = "docs/lz-study.md",
    backend: str = "vllm",
    limit: int | None = None,
    max_gen_toks: int | None = None,
    batch_size: str = "auto",
) -> int:
    out = Path(out).resolve()
    rows = []
    started = time.time()
    for number, setting in enumerate(SETTINGS, 1):
        model_args = {"backend": backend, "pretrained": "embedded", **setting.model_args}
        if backend == "vllm":
            model_args.update(VLLM_ARGS)
        run = LmEvalRun(
            model="lz",
            model_args=model_args,
            tasks=[TASK],
            output_path=out / setting.name.replace(" ", "-"),
            batch_size=batch_size,
            limit=limit,
            gen_kwargs=f"max_gen_toks={max_gen_toks}" if max_gen_toks is not None else None,
        )
        print(f"\n[{number}/{len(SETTINGS)}] {setting.name}: {run.shown()}", flush=True)
        results = run.run()
        if results is None:
            print(f"{setting.name} FAILED", file=sys.stderr)
            return 1
        rows.append((setting, results))
    text = study_table(rows, backend, limit, max_gen_toks, time.time() - started)
    return write_doc(doc, text)


def study_table(rows, backend: str, limit, max_gen_toks, seconds: float) -> str:
    first = json.loads(rows[0][1].read_text())
    info = first["config"]["decodebench"]
    lines = [
        "# LZ penalty study: repetition and task score on the embedded model",
        "",
        f"Written by `python studies/lz_study.py --backend {backend}"
        + (f" --limit {limit}" if limit else "")
        + (f" --max-gen-toks {max_gen_toks}" if max_gen_toks else "")
        + f"` on {datetime.now(UTC):%Y-%m-%d} ({seconds / 60:.0f} min).",
        "",
        f"- model: the embedded SmolLM2-135M-Instruct (`{info['pretrained']}`), greedy decoding, chat template",
        f"- task: `{TASK}`, {first['n-samples'][TASK]['effective']} AIME 2024/2025 problems, up to "
        f"{max_gen_toks or 1024} new tokens; score = lm-eval's AIME exact match",
        "- degenerate = one unit repeated back to back at least 20 times, or a drifting chain of such loops "
        "(decodebench.metrics.degenerate_repetition)",
        f"- backend: {backend}; machine: {short_name(info['machine'])}",
        "",
        "| penalty | exact match | degenerate rate | mean new tokens | hit max length | tokens/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for setting, path in rows:
        results = json.loads(path.read_text())
        scores = results["results"][TASK]
        stats = results["config"]["decodebench"]["tasks"][TASK]
        requests = stats["requests"]
        lines.append(
            f"| {setting.name} | {scores['exact_match,none']:.3f} | {scores['degenerate_repetition,none']:.3f} "
            f"| {stats['new_tokens'] / requests:.0f} | {stats['finish_reasons']['length'] / requests:.0%} "
            f"| {stats['tokens_per_second']:.1f} |"
        )
    lines += [
        "",
        "Tokens/s compares settings within this table only (same machine, same backend, same run).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/lz-study.md")
    parser.add_argument("--backend", default="vllm", choices=("hf", "vllm"), help="inference backend (default vllm)")
    parser.add_argument("--out", default="results/lz-study", help="lm_eval output folder")
    parser.add_argument("--limit", type=int, default=None, help="problems per run (default: all)")
    parser.add_argument("--max-gen-toks", type=int, default=None, help="override the task's 1024 new tokens")
    parser.add_argument("--batch-size", default="auto", help="lm_eval --batch_size (default auto)")
    args = parser.parse_args(argv)
    return run_study(args.out, args.doc, args.backend, args.limit, args.max_gen_toks, args.batch_size)


if __name__ == "__main__":
    raise SystemExit(main())
