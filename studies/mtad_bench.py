"""MTAD in the paper's settings, next to speculative sampling and the target alone (``tox -e mtad-bench``).

``python studies/mtad_bench.py`` writes docs/benchmarks/mtad.md. The embedded model, batch 1
(the paper's setting), up to 128 new tokens, on the task prompts of the bundled real samples
(cnndm_mini articles to summarize, squad_mini questions), in the chat template. Two decodings:
the paper's sampling (Appendix F: temperature 1, top-k 20, top-p 0.9) and greedy. For each:
target-only, then speculative sampling and MTAD (Algorithm 1) with each draft (the target's
first layers, prompt lookup, the infini-gram reference index).

All settings run on one loaded model through ``--model mtad``'s own measured ``generate_until``,
prompt by prompt in interleaved rounds (round i runs every setting on prompt i, in an order
rotated each round), so that a speed ratio compares the same prompts at the same moment of a
noisy machine. Reported: tokens/s, its ratio to target-only of the same decoding with the 95%
interval of the paired bootstrap over prompts, block efficiency (1 + accepted / iterations),
acceptance rate, mean new tokens, and the target's perplexity of the output (per prompt, then the
mean, with its interval); MTAD's perplexity is paired with speculative sampling's on the same
draft and prompts.
"""

from __future__ import annotations

import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from common import doc_parser, task_docs, write_doc

DRAFTS = ("self:10", "context", "infinigram")
DECODINGS = {
    "sampling": {"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.9},
    "greedy": {"do_sample": False},
}


def settings() -> list[tuple[str, str, dict]]:
    """(decoding, setting name, --model mtad arguments), target-only first within each decoding."""
    out = []
    for decoding in DECODINGS:
        out.append((decoding, "target-only", {"mode": "target"}))
        for mode, label in (("speculative", "speculative"), ("mtad", "MTAD")):
            out += [(decoding, f"{label}, {draft}", {"mode": mode, "draft": draft}) for draft in DRAFTS]
    return out


def prompts(tokenizer, limit: int) -> list[str]:
    """cnndm_mini's summarization prompts (the task's own) and squad_mini's bare questions, in the chat template."""
    cnndm, articles = task_docs("cnndm_mini", limit - limit // 2)
    _, questions = task_docs("squad_mini", limit // 2)
    texts = [cnndm.doc_to_text(doc) for doc in articles] + [doc["question"] for doc in questions]
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in texts
    ]


class Setting:
    """One (decoding, method) pair: its method instance and its own measurement recorder."""

    def __init__(self, model, decoding: str, name: str, args: dict):
        from decodebench.models.mtad import MTAD, MTADConfig

        self.decoding, self.name = decoding, name
        self.method = MTAD(MTADConfig.parse(args)[0])
        model.method = self.method
        self.method.setup(model)
        model.init_measurement(model.decodebench_recorder.meter, memory=model.decodebench_recorder.memory)
        self.recorder = model.decodebench_recorder
        self.texts: list[str] = []

    def run(self, model, prompt: str, doc_id: int, new_tokens: int) -> None:
        model.method, model.decodebench_recorder = self.method, self.recorder
        kwargs = {"until": [], "max_gen_toks": new_tokens, **DECODINGS[self.decoding]}
        (text,) = model.generate_until(
            [SimpleNamespace(task_name="bench", doc_id=doc_id, idx=0, args=(prompt, kwargs))]
        )
        self.texts.append(text)

    @property
    def records(self):
        return sorted(self.recorder.records, key=lambda r: r.doc_id)


def per_prompt(setting: Setting) -> tuple[list[int], list[float], list[float]]:
    """New tokens, seconds and perplexity of each prompt, in prompt order."""
    records = setting.records
    return (
        [r.new_tokens for r in records],
        [r.latency_s for r in records],
        [r.method_stats.get("target_perplexity", float("nan")) for r in records],
    )


def run(doc: str | Path = "docs/benchmarks/mtad.md", limit: int = 12, new_tokens: int = 128) -> int:
    from decodebench.measure.machine import describe, short_name
    from decodebench.models.mtad import MTAD, MTADConfig
    from decodebench.stats import bootstrap_interval, paired_comparison, speed_ratio_interval

    model = MTAD.create({"pretrained": "embedded", "device": "cpu", "batch_size": 1, "mode": "target"})
    texts = prompts(model.tokenizer, limit)
    runs = [Setting(model, *setting) for setting in settings()]
    started = time.perf_counter()
    for i, prompt in enumerate(texts):
        order = runs[i % len(runs) :] + runs[: i % len(runs)]  # rotated: no setting always runs first
        for setting in order:
            setting.run(model, prompt, i, new_tokens)
        print(f"round {i + 1}/{len(texts)} done, {time.perf_counter() - started:.0f} s", flush=True)

    by_key = {(s.decoding, s.name): s for s in runs}
    lines = [
        "# MTAD benchmark: the paper's settings on the embedded model",
        "",
        f"Written by `python studies/mtad_bench.py --limit {limit} --new-tokens {new_tokens}` (`tox -e mtad-bench`) on "
        f"{datetime.now(UTC):%Y-%m-%d}, machine: {short_name(describe('cpu'))}, "
        f"{time.perf_counter() - started:.0f} s in all.",
        f"n = {len(texts)} prompts ({limit - limit // 2} cnndm_mini articles to summarize, {limit // 2} squad_mini "
        f"questions), chat template, batch 1, up to {new_tokens} new tokens, gamma {MTADConfig.defaults().gamma}, "
        f"{MTADConfig.defaults().beams} beams, tau {MTADConfig.defaults().tau}. Every setting ran every prompt in "
        "interleaved rounds; a speed ratio is against target-only of the same decoding on the same prompts, with the "
        "95% interval of the paired bootstrap over prompts. Perplexity is the target's on the output "
        "(mean over prompts, 95% bootstrap interval).",
        "",
    ]
    summary_json = {}
    for decoding in DECODINGS:
        base = by_key[(decoding, "target-only")]
        base_tokens, base_seconds, _ = per_prompt(base)
        title = "Sampling (Appendix F: T = 1, top-k 20, top-p 0.9)" if decoding == "sampling" else "Greedy"
        lines += [
            f"## {title}",
            "",
            "| setting | tokens/s | vs target-only [95% CI] | block efficiency | acceptance | mean new tokens "
            "| perplexity [95% CI] | same text as target-only |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for setting in (s for s in runs if s.decoding == decoding):
            tokens, seconds, ppl = per_prompt(setting)
            ratio, interval = speed_ratio_interval(tokens, seconds, base_tokens, base_seconds)
            method = setting.recorder.task_summaries()["bench"]["method"]
            block, accept = method.get("block_efficiency"), method.get("acceptance_rate")
            ppl_interval = bootstrap_interval(ppl, lambda rows: rows.mean())
            same = sum(a == b for a, b in zip(setting.texts, base.texts, strict=True))
            lines.append(
                f"| {setting.name} | {sum(tokens) / sum(seconds):.2f} | {ratio:.2f}x "
                f"[{interval.low:.2f}, {interval.high:.2f}] | {f'{block:.2f}' if block else '-'} "
                f"| {f'{accept:.2f}' if accept is not None else '-'} | {statistics.mean(tokens):.0f} "
                f"| {statistics.mean(ppl):.2f} [{ppl_interval.low:.2f}, {ppl_interval.high:.2f}] "
                f"| {same}/{len(texts)} |"
            )
            summary_json[f"{decoding} / {setting.name}"] = {
                "speed_ratio": ratio,
                "speed_ratio_interval": interval.as_list(),
                "block_efficiency": block,
                "acceptance_rate": accept,
                "perplexity": statistics.mean(ppl),
                "acceptance_histogram": method.get("acceptance_histogram"),
            }
        lines += ["", "MTAD against speculative sampling with the same draft, paired on the prompts:", ""]
        for draft in DRAFTS:
            _, _, mtad_ppl = per_prompt(by_key[(decoding, f"MTAD, {draft}")])
            _, _, spec_ppl = per_prompt(by_key[(decoding, f"speculative, {draft}")])
            paired = paired_comparison(mtad_ppl, spec_ppl)
            lines.append(
                f"- {draft}: perplexity difference {paired.difference:+.2f} "
                f"[{paired.interval.low:+.2f}, {paired.interval.high:+.2f}], p = {paired.p_value:.3f} "
                f"({paired.test}, n = {paired.n})"
            )
        lines.append("")
    energy = runs[0].recorder.task_summaries()["bench"]["energy_unavailable_reason"]
    lines += [
        "Greedy MTAD makes p one-hot (the authors' code), so it keeps exactly what greedy decoding would emit: its "
        "text equals target-only's up to floating-point ties, and the speed-up is all it can change.",
        f"J/token: {energy or 'see the results JSON'}.",
        "",
        "```json",
        json.dumps(summary_json, indent=1),
        "```",
        "",
    ]
    return write_doc(doc, "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, "docs/benchmarks/mtad.md")
    parser.add_argument("--limit", type=int, default=12, help="prompts: half cnndm_mini articles, half squad_mini")
    parser.add_argument("--new-tokens", type=int, default=128, help="new tokens per prompt at most")
    args = parser.parse_args(argv)
    return run(args.doc, args.limit, args.new_tokens)


if __name__ == "__main__":
    raise SystemExit(main())
