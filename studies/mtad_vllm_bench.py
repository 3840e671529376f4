"""MTAD inside vLLM's engine under load: target-only, vLLM's speculative sampling, MTAD and block verification.

``tox -e mtad-vllm-bench`` (``python studies/mtad_vllm_bench.py``) starts three ``decodebench serve`` servers of the
embedded model on vLLM's CPU build: one without speculation (target-only), one drafting with vLLM's n-gram proposer
(``draft=context``) and one with the target's first 10 layers as a draft model (``draft=self:10``, its
probabilities passed to the verifier), each drafting gamma = 4 tokens, exactly as ``--model mtad
--model_args backend=vllm`` configures its engine. On the speculating servers, a request of ``--model baseline`` is
verified by vLLM's standard rule, one of ``--model mtad`` by MTAD's and one of ``--model mtad --model_args
mode=block`` by block verification (Sun et al.; decodebench's plugin, per request), so all share the server's
batches. Every configuration runs summarization (cnndm_mini) and SQuAD (squad_mini) prompts at
1, 4 and 16 requests in flight, sampled as the paper's Appendix F (temperature 1, top-k 20, top-p 0.9) and greedy,
in rounds whose order alternates. Speed is each task's output tokens over its wall time, its ratio to target-only
paired per round with a 95% bootstrap interval over rounds; block efficiency and acceptance come from the servers'
counters; the outputs' perplexity under the target (transformers, after all runs, outside every timed window) is
paired per document between each rule and speculative sampling on the same draft.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from common import (
    COLD_CACHE_NOTE,
    keep_lm_eval_run,
    load_json,
    load_study_main,
    ms_percentiles,
    record_run,
    run_header,
    save_json,
    serving,
)

DOC = "docs/benchmarks/mtad-vllm.md"
LEVELS = (1, 4, 16)
TASKS = ("cnndm_mini", "squad_mini")
SERVER_ARGS = ("--max-model-len", "2048", "--seed", "0")
DECODINGS = {
    "sampled": "do_sample=true,temperature=1.0,top_k=20,top_p=0.9",  # Appendix F, the same for every row
    "greedy": "",
}
# (row, server, lm_eval model, its own model_args, decodings); greedy MTAD is vLLM's greedy rule (p is one-hot), so
# greedy runs target and speculative alone
CONFIGS = (
    ("target", "target", "baseline", {}, ("sampled", "greedy")),
    ("speculative, context", "context", "baseline", {}, ("sampled", "greedy")),
    ("MTAD, context", "context", "mtad", {"mode": "mtad"}, ("sampled",)),
    ("speculative, self:10", "self:10", "baseline", {}, ("sampled", "greedy")),
    ("MTAD, self:10", "self:10", "mtad", {"mode": "mtad"}, ("sampled",)),
    ("block, context", "context", "mtad", {"mode": "block"}, ("sampled",)),
    ("block, self:10", "self:10", "mtad", {"mode": "block"}, ("sampled",)),
)
PAIRS = tuple(
    (f"{rule}, {draft}", f"speculative, {draft}") for rule in ("MTAD", "block") for draft in ("context", "self:10")
)


def slug(row: str) -> str:
    return row.replace(", ", "-").replace(":", "").lower()


def server_args(draft: str) -> list[str]:
    from decodebench.data.embedded import resolve_pretrained
    from decodebench.models.mtad.config import MTADConfig
    from decodebench.models.mtad.vllm_engine import speculative_config

    if draft == "target":
        return list(SERVER_ARGS)
    pretrained, _ = resolve_pretrained(None)
    spec = speculative_config(MTADConfig(draft=draft), str(pretrained))
    return [*SERVER_ARGS, "--speculative-config", json.dumps(spec)]


def collect(folder: Path, argv: list[str], limit: int, rounds: int, max_gen_toks: int, out: str) -> None:
    from contextlib import ExitStack

    from decodebench.commands.runs import LmEvalRun
    from decodebench.commands.sweep import warm_up

    started = time.time()
    out_dir = Path(out).resolve()
    produced: list[tuple[Path, Path]] = []  # (lm_eval results, where its data is kept)
    with ExitStack() as servers:
        urls = {name: servers.enter_context(serving(*server_args(name))) for name in ("target", "context", "self:10")}
        for url in urls.values():  # every prompt in each server's prefix cache before any timed run
            warm_up(url, {"pretrained": "embedded"}, list(TASKS), limit, max(LEVELS))
        for number in range(rounds):
            levels = LEVELS if number % 2 == 0 else LEVELS[::-1]
            for position, level in enumerate(levels):
                for decoding, gen_kwargs in DECODINGS.items():
                    rows = [c for c in CONFIGS if decoding in c[4]]
                    for row, server, model, own, _ in rows if (number + position) % 2 == 0 else rows[::-1]:
                        where = Path(f"round-{number + 1}") / decoding / f"concurrency-{level}" / slug(row)
                        args = {"pretrained": "embedded", "backend": "served", "base_url": urls[server]}
                        run = LmEvalRun(
                            model=model,
                            model_args={**args, "num_concurrent": level, **own},
                            tasks=list(TASKS),
                            output_path=out_dir / where,
                            limit=limit,
                            gen_kwargs=",".join(filter(None, (gen_kwargs, f"max_gen_toks={max_gen_toks}"))),
                        )
                        results = run.run_or_raise(
                            f"[round {number + 1}/{rounds}, {level} in flight, {decoding}] {row}"
                        )
                        produced.append((results, folder / where))
    for results, kept in produced:
        keep_lm_eval_run(results, kept)
        if kept.parts[-3] == "sampled" and any(slug(row) == kept.name for pair in PAIRS for row in pair):
            save_json(kept, "perplexity.json", output_perplexities(results))
    record_run(
        folder, __file__, argv, started, levels=list(LEVELS), limit=limit, max_gen_toks=max_gen_toks, warm_up=True
    )


_scorer: dict = {}


def output_perplexities(results: Path) -> dict[str, dict[str, list[float]]]:
    """{task: {doc_id: [nll, tokens]}}: each output re-tokenized and scored after its prompt by the target in
    float32 (models/mtad/method.py's output_nll, the transformers path's perplexity)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodebench.data.embedded import resolve_pretrained
    from decodebench.models.mtad.method import output_nll

    if not _scorer:
        pretrained, _ = resolve_pretrained(None)
        _scorer["tokenizer"] = AutoTokenizer.from_pretrained(pretrained)
        _scorer["model"] = AutoModelForCausalLM.from_pretrained(pretrained, dtype=torch.float32).eval()
    tokenizer, model = _scorer["tokenizer"], _scorer["model"]
    date_id = results.stem.removeprefix("results_")
    scored: dict[str, dict[str, list[float]]] = {}
    for task in TASKS:
        (samples,) = results.parent.glob(f"samples_{task}_{date_id}.jsonl")
        scored[task] = {}
        for line in samples.read_text().splitlines():
            sample = json.loads(line)
            prompt = tokenizer(sample["arguments"]["gen_args_0"]["arg_0"], add_special_tokens=False).input_ids
            output = tokenizer(sample["resps"][0][0], add_special_tokens=False).input_ids
            if output:
                with torch.inference_mode():
                    nll = output_nll(model, torch.tensor(prompt), output)
                scored[task][str(sample["doc_id"])] = [nll, len(output)]
    return scored


# -- rendering ------------------------------------------------------------------------------------------------------
def read(folder: Path) -> dict:
    """{(decoding, level, row): [round's run folder, ...]} from the data folder."""
    from common import kept_results

    found: dict = {}
    for round_folder in sorted(folder.glob("round-*"), key=lambda p: int(p.name.split("-")[1])):
        for decoding in DECODINGS:
            for level in LEVELS:
                for row, *_ in CONFIGS:
                    run = round_folder / decoding / f"concurrency-{level}" / slug(row)
                    if run.is_dir():
                        found.setdefault((decoding, level, row), []).append(kept_results(run))
    return found


def task_measure(results: Path, task: str) -> dict:
    from decodebench.reports.reader import read_text

    return json.loads(read_text(results))["config"]["decodebench"]["tasks"][task]


QUALITY = {"cnndm_mini": "rougeL", "squad_mini": "f1"}


def quality(results: Path, task: str) -> str:
    """The task's metric over its documents with its 95% t interval (kept inside [0, 1])."""
    from decodebench.reports.reader import read_text, samples_log
    from decodebench.stats import quality_interval

    name = QUALITY[task]
    values = [json.loads(line)[name] for line in read_text(samples_log(results, task)).splitlines() if line.strip()]
    interval, _ = quality_interval(values, binary=False, bounds=(0.0, 1.0))
    return f"{name} {sum(values) / len(values):.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def render(folder: Path) -> str:
    from decodebench.measure.vllm_counters import SPEC_DECODE  # the servers' speculative-decoding counters
    from decodebench.stats import sign_flip_comparison, speed_ratio_interval

    run = load_json(folder, "run.json")
    found = read(folder)
    rounds = max(len(v) for v in found.values())
    lines = [
        *run_header(folder, "MTAD inside vLLM's engine, served under load", "mtad-vllm-bench"),
        f"Three `decodebench serve` servers of the embedded model (vLLM's CPU build, `{' '.join(SERVER_ARGS)}`, "
        "bfloat16): target-only, vLLM's n-gram proposer (`draft=context`) and the target's first 10 layers as a "
        "draft model (`draft=self:10`), gamma = 4. On a speculating server `--model baseline` requests are "
        "verified by vLLM's standard rule (speculative sampling, or greedy speculative decoding), `--model mtad` "
        "requests by MTAD's (tau = 0.1) and `--model mtad --model_args mode=block` requests by block verification "
        "(Sun et al., Algorithm 2: lossless, like vLLM's rule), in the same batches (vLLM's V1 model runner, where "
        "decodebench's plugin applies both). "
        f"{run['limit']} documents per task, up to {run['max_gen_toks']} new tokens, chat template; sampled as "
        "Appendix F (temperature 1, top-k 20, top-p 0.9) for every row, or greedy (where MTAD and block "
        f"verification are vLLM's greedy rule: not run again). {rounds} rounds, the levels' and the rows' order "
        "alternating. tokens/s: output "
        "tokens over the task's wall time, the mean over rounds; the ratio to target-only at the same load is "
        "paired per round with its 95% bootstrap interval over rounds; block efficiency: 1 + accepted / drafts "
        "from the server's counters (every round); quality: the task's metric (ROUGE-L, SQuAD F1) over the "
        "documents of round 1 with its 95% t interval; TTFT and TPOT (as `vllm bench serve` defines them) as "
        "p50/p90/p99 over round 1's requests.",
        "",
    ]
    for decoding in DECODINGS:
        for task in TASKS:
            lines += [
                f"## {task}, {decoding}",
                "",
                "| in flight | row | tokens/s | vs target-only [95% CI] | block efficiency | acceptance rate "
                "| TTFT (ms) | TPOT (ms) | quality [95% CI] |",
                "|---:|---|---:|---|---:|---:|---|---|---:|",
            ]
            for level in LEVELS:
                base = found.get((decoding, level, "target"))
                if not base:
                    continue
                base_m = [task_measure(r, task) for r in base]
                for row, *_ in CONFIGS:
                    runs = found.get((decoding, level, row))
                    if not runs:
                        continue
                    measured = [task_measure(r, task) for r in runs]
                    tps = sum(m["new_tokens"] / m["generate_seconds"] for m in measured) / len(measured)
                    versus = ""
                    if row != "target":
                        paired = min(len(measured), len(base_m))
                        ratio, interval = speed_ratio_interval(
                            [m["new_tokens"] for m in measured[:paired]],
                            [m["generate_seconds"] for m in measured[:paired]],
                            [m["new_tokens"] for m in base_m[:paired]],
                            [m["generate_seconds"] for m in base_m[:paired]],
                        )
                        versus = f"{ratio:.2f}x [{interval.low:.2f}, {interval.high:.2f}]"

                    def counted(name: str, measured=measured) -> float:  # a server counter summed over rounds
                        return sum((m.get("engine") or {}).get(f"{SPEC_DECODE}{name}_total", 0) for m in measured)

                    drafts, accepted = counted("num_drafts"), counted("num_accepted_tokens")
                    drafted = counted("num_draft_tokens")
                    efficiency = f"{1 + accepted / drafts:.2f}" if drafts else "-"
                    acceptance = f"{accepted / drafted:.2f}" if drafted else "-"
                    lines.append(
                        f"| {level} | {row} | {tps:.1f} | {versus} | {efficiency} | {acceptance} | "
                        f"{ms_percentiles(measured[0].get('ttft_s'))} | {ms_percentiles(measured[0].get('tpot_s'))} | "
                        f"{quality(runs[0], task)} |"
                    )
            lines.append("")
    lines += [
        f"With {rounds} rounds, each ratio's interval rests on {rounds} paired ratios: read it as the spread of what "
        "was seen, not as a calibrated 95% interval.",
        "",
        *([] if run.get("warm_up") else [COLD_CACHE_NOTE, ""]),
        "Why speculation stops paying as the load grows here: on a CPU the target's forward pass costs in proportion "
        "to the positions it processes, so verifying gamma + 1 positions per request costs about what as many "
        "decode steps would once the batch fills the two cores; with one request in flight a step is bound by "
        "reading the weights, and the extra positions come almost free. The self:10 draft is the target's first 10 "
        "of its 30 layers with its LM head: each drafted token costs a third of a target step, and its drafts are "
        "rarely accepted (the acceptance column), so every row with it is slower than the target alone. With the "
        "same drafts, MTAD's rule accepts more than speculative sampling does (the block efficiency columns), "
        "which is what the rule is built to do. Block verification keeps at least as many draft tokens as "
        "speculative sampling on the same drafts, in expectation (kernels/mtad.py's tests: 11/9 against 10/9 on the "
        "paper's example), and its outputs follow the target's distribution as speculative sampling's do; here each "
        "row drafts from its own sampled text (the n-gram proposer copies from it, and the outputs differ), so at "
        "this size its block efficiency falls below speculative sampling's at some loads and above at others: no "
        "difference between the two is shown here, in speed, acceptance or perplexity (below).",
        "",
        "## Perplexity of the sampled outputs: each rule against speculative sampling on the same draft",
        "",
        "Each output re-tokenized and scored after its prompt by the target (transformers, float32); a document's "
        "perplexity is exp(its summed NLL over its tokens) over every round and load it was generated at, and each "
        "rule is paired with speculative sampling per document (sign-flip permutation test and its interval).",
        "",
        "| rule | draft | task | n | speculative | rule | rule - speculative [95% CI], p |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for rule_row, spec_row in PAIRS:
        for task in TASKS:
            per_doc = {row: pooled_perplexity(folder, found, row, task) for row in (rule_row, spec_row)}
            docs = sorted(set(per_doc[rule_row]) & set(per_doc[spec_row]), key=int)
            if not docs:
                continue
            rule = [per_doc[rule_row][d] for d in docs]
            spec = [per_doc[spec_row][d] for d in docs]
            test = sign_flip_comparison([m - s for m, s in zip(rule, spec, strict=True)])
            low, high = test.interval.as_list()
            name, draft = rule_row.split(", ")
            lines.append(
                f"| {name} | {draft} | {task} | {len(docs)} | {sum(spec) / len(spec):.2f} | "
                f"{sum(rule) / len(rule):.2f} | {test.difference:+.2f} [{low:+.2f}, {high:+.2f}], "
                f"p={test.p_value:.3g} |"
            )
    lines.append("")
    return "\n".join(lines)


def pooled_perplexity(folder: Path, found: dict, row: str, task: str) -> dict[str, float]:
    """{doc_id: exp(sum of NLL / sum of tokens)} over every round and load of a sampled row."""
    nll: dict[str, float] = {}
    tokens: dict[str, float] = {}
    for level in LEVELS:
        for results in found.get(("sampled", level, row), []):
            path = results.parent / "perplexity.json"
            if not path.is_file():
                continue
            for doc, (value, count) in json.loads(path.read_text())[task].items():
                nll[doc] = nll.get(doc, 0.0) + value
                tokens[doc] = tokens.get(doc, 0) + count
    return {doc: math.exp(nll[doc] / tokens[doc]) for doc in nll if tokens[doc]}


def main(argv: list[str] | None = None) -> int:
    return load_study_main(
        argv, __doc__, DOC, collect, render, limit=8, rounds=3, max_gen_toks=64, out="results/mtad-vllm-bench"
    )


if __name__ == "__main__":
    raise SystemExit(main())
