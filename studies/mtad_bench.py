"""MTAD in the paper's settings, next to speculative sampling, the target alone and transformers' prompt lookup.

``tox -e mtad-bench`` (``python studies/mtad_bench.py``) writes docs/benchmarks/mtad.md. The embedded model,
batch 1 (the paper's setting), on the task prompts of the bundled real samples (cnndm_mini articles to summarize,
squad_mini questions), in the chat template. Two decodings: the paper's sampling (Appendix F: temperature 1, top-k
20, top-p 0.9) and greedy. For each: target-only, then speculative sampling and MTAD (Algorithm 1) with each draft
(the target's first layers, prompt lookup, the infini-gram reference index), and transformers' own assisted
generation with prompt lookup as a peer (``mode=assisted,draft=context``).

All settings run on one loaded model through ``--model mtad``'s own measured ``generate_until``, prompt by prompt in
interleaved rounds (round i runs every setting on prompt i, in an order rotated each round), so that a speed ratio
compares the same prompts at the same moment of a noisy machine. The data folder keeps, per setting and prompt, the
new tokens, seconds, the target's perplexity of the output and a hash of the text, and per setting the method's
counters; the page is rendered from it: tokens/s, its ratio to target-only of the same decoding with the 95%
interval of the bootstrap over prompts (paired), block efficiency (1 + accepted / iterations), acceptance rate, mean
new tokens, the perplexity's mean with its t interval, and MTAD's perplexity paired with speculative sampling's on
the same draft and prompts (sign-flip permutation test and the interval that inverts it).
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

from common import doc_parser, load_json, page, record_run, run_header, save_json, task_docs

DOC = "docs/benchmarks/mtad.md"
DRAFTS = ("self:10", "context", "infinigram")
DECODINGS = {
    "sampling": {"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.9},
    "greedy": {"do_sample": False},
}
TARGET_ONLY = "target-only"
PEER = "transformers' prompt lookup"
SETTINGS_FILE = "settings.json"


def settings() -> list[tuple[str, str, dict]]:
    """(decoding, setting name, --model mtad arguments), target-only first within each decoding, the peer last."""
    out = []
    for decoding in DECODINGS:
        out.append((decoding, TARGET_ONLY, {"mode": "target"}))
        for mode, label in (("speculative", "speculative"), ("mtad", "MTAD")):
            out += [(decoding, f"{label}, {draft}", {"mode": mode, "draft": draft}) for draft in DRAFTS]
        out.append((decoding, PEER, {"mode": "assisted", "draft": "context"}))
    return out


def prompts(tokenizer, limit: int) -> tuple[list[str], list[str]]:
    """cnndm_mini's summarization prompts (the task's own) and squad_mini's bare questions, in the chat template,
    and what each prompt is (task and document index)."""
    cnndm, articles = task_docs("cnndm_mini", limit - limit // 2)
    _, questions = task_docs("squad_mini", limit // 2)
    texts = [cnndm.doc_to_text(doc) for doc in articles] + [doc["question"] for doc in questions]
    names = [f"cnndm_mini/{i}" for i in range(len(articles))] + [f"squad_mini/{i}" for i in range(len(questions))]
    chat = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in texts
    ]
    return chat, names


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


def collect(folder: Path, argv: list[str], limit: int, new_tokens: int) -> None:
    from decodebench.models.mtad import MTAD, MTADConfig

    started_at = time.time()
    model = MTAD.create({"pretrained": "embedded", "device": "cpu", "batch_size": 1, "mode": "target"})
    texts, names = prompts(model.tokenizer, limit)
    Setting(model, "greedy", "warm-up", {"mode": "target"}).run(model, texts[0], 0, 8)  # lazy set-up, untimed
    runs = [Setting(model, *setting) for setting in settings()]
    started = time.perf_counter()
    for i, prompt in enumerate(texts):
        order = runs[i % len(runs) :] + runs[: i % len(runs)]  # rotated: no setting always runs first
        for setting in order:
            setting.run(model, prompt, i, new_tokens)
        print(f"round {i + 1}/{len(texts)} done, {time.perf_counter() - started:.0f} s", flush=True)
    kept: dict[str, dict] = {}
    for setting in runs:
        records = setting.records
        method = setting.recorder.task_summaries()["bench"]["method"]
        kept.setdefault(setting.decoding, {})[setting.name] = {
            "new_tokens": [r.new_tokens for r in records],
            "seconds": [r.latency_s for r in records],
            "perplexity": [r.method_stats.get("target_perplexity") for r in records],
            "text_sha256": [hashlib.sha256(t.encode()).hexdigest()[:16] for t in setting.texts],
            "block_efficiency": method.get("block_efficiency"),
            "acceptance_rate": method.get("acceptance_rate"),
            "acceptance_histogram": method.get("acceptance_histogram"),
        }
    save_json(folder, SETTINGS_FILE, {"prompts": names, "settings": kept})
    defaults = MTADConfig.defaults()
    energy = runs[0].recorder.task_summaries()["bench"]["energy_unavailable_reason"]
    record_run(
        folder,
        __file__,
        argv,
        started_at,
        limit=limit,
        new_tokens=new_tokens,
        gamma=defaults.gamma,
        beams=defaults.beam_width,
        tau=defaults.tau,
        energy_unavailable_reason=energy,
    )


def render(folder: Path) -> str:
    from decodebench.stats import APPROXIMATE_BELOW, paired_comparison, speed_ratio_interval, t_interval, within

    run = load_json(folder, "run.json")
    data = load_json(folder, SETTINGS_FILE)
    n = len(data["prompts"])
    cnndm = sum(name.startswith("cnndm") for name in data["prompts"])
    lines = [
        *run_header(folder, "MTAD benchmark: the paper's settings on the embedded model", "mtad-bench"),
        f"n = {n} prompts ({cnndm} cnndm_mini articles to summarize, {n - cnndm} squad_mini questions), chat "
        f"template, batch 1, up to {run['new_tokens']} new tokens, gamma {run['gamma']}, {run['beams']} beams, tau "
        f"{run['tau']}. Every setting ran every prompt in interleaved rounds (the order rotated per prompt); a speed "
        "ratio is against target-only of the same decoding on the same prompts, with the 95% interval of the "
        "bootstrap over prompts (both sides resampled together). Perplexity is the target's on the output: the mean "
        f"over prompts with its 95% t interval{' (approximate: n below 10)' if n < APPROXIMATE_BELOW else ''}. "
        f"`{PEER}` is transformers' assisted generation with its prompt-lookup candidates "
        "(`mode=assisted,draft=context`), a peer measured by the same loop.",
        "",
    ]
    for decoding in DECODINGS:  # the collected order (the data file's keys are sorted)
        rows = data["settings"][decoding]
        base = rows[TARGET_ONLY]
        title = "Sampling (Appendix F: T = 1, top-k 20, top-p 0.9)" if decoding == "sampling" else "Greedy"
        lines += [
            f"## {title}",
            "",
            "| setting | tokens/s | vs target-only [95% CI] | block efficiency | acceptance | mean new tokens "
            "| perplexity [95% CI] | same text as target-only |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name in (name for setting_decoding, name, _ in settings() if setting_decoding == decoding):
            row = rows[name]
            ratio, interval = speed_ratio_interval(
                row["new_tokens"], row["seconds"], base["new_tokens"], base["seconds"]
            )
            block, accept = row["block_efficiency"], row["acceptance_rate"]
            ppl = [value for value in row["perplexity"] if value is not None]  # None: an empty output
            ppl_interval = within(t_interval(ppl), (1.0, math.inf))  # a perplexity is at least 1
            same = sum(a == b for a, b in zip(row["text_sha256"], base["text_sha256"], strict=True))
            lines.append(
                f"| {name} | {sum(row['new_tokens']) / sum(row['seconds']):.2f} | {ratio:.2f}x "
                f"[{interval.low:.2f}, {interval.high:.2f}] | {f'{block:.2f}' if block else '-'} "
                f"| {f'{accept:.2f}' if accept is not None else '-'} | {statistics.mean(row['new_tokens']):.0f} "
                f"| {statistics.mean(ppl):.2f} [{ppl_interval.low:.2f}, {ppl_interval.high:.2f}] "
                f"| {same}/{n} |"
            )
        lines += ["", "MTAD against speculative sampling with the same draft, perplexity paired on the prompts:", ""]
        for draft in DRAFTS:
            pairs = [
                (a, b)
                for a, b in zip(
                    rows[f"MTAD, {draft}"]["perplexity"], rows[f"speculative, {draft}"]["perplexity"], strict=True
                )
                if a is not None and b is not None
            ]
            paired = paired_comparison([a for a, _ in pairs], [b for _, b in pairs], binary=False)
            lines.append(
                f"- {draft}: perplexity difference {paired.difference:+.2f} "
                f"[{paired.interval.low:+.2f}, {paired.interval.high:+.2f}], p = {paired.p_value:.3g} "
                f"({paired.test}, n = {paired.n})"
            )
        lines.append("")
    lines += [
        "Greedy MTAD makes p one-hot (the authors' code), so it keeps exactly what greedy decoding would emit: its "
        "text equals target-only's up to floating-point ties, and the speed-up is all it can change.",
        f"J/token: {run['energy_unavailable_reason'] or 'see the results JSON'}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, DOC)
    parser.add_argument("--limit", type=int, default=8, help="prompts: half cnndm_mini articles, half squad_mini")
    parser.add_argument("--new-tokens", type=int, default=64, help="new tokens per prompt at most (default 64)")
    args = parser.parse_args(argv)
    return page(args, argv, lambda folder, command: collect(folder, command, args.limit, args.new_tokens), render)


if __name__ == "__main__":
    raise SystemExit(main())
