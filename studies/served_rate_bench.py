"""MTAD and speculative sampling at request rates: goodput under a latency objective, through one vllm serve.

``tox -e served-rate-bench`` (``python studies/served_rate_bench.py``) starts one ``decodebench serve`` server of the
embedded model on vLLM's CPU build drafting with vLLM's n-gram proposer (``draft=context``, gamma = 4, as ``--model
mtad --model_args backend=vllm`` configures its engine), then runs ``decodebench sweep`` from one request at a time
(``synchronous``) through open-loop request rates (Poisson arrivals, vllm bench serve's process) to every request at
once (``throughput``), GuideLLM's sweep: ``--model baseline`` (vLLM's speculative sampling on
those drafts) and ``--model mtad`` (MTAD's rule on the same drafts, per request), sampled as the paper's Appendix F,
in rounds whose order alternates after one untimed pass of every prompt. Per rate it reports each side's
throughput, their ratio paired per round with a 95% interval, TTFT and TPOT percentiles, quality with its paired
test, and the share of requests within the objectives (pooled over rounds, Wilson interval, n) with goodput; then
the heaviest load at which each kept 90% of its requests within them. The page is rendered from the data it keeps.
"""

from __future__ import annotations

import time
from pathlib import Path

from common import keep_sweep_runs, load_json, load_study_main, record_run, run_header, serving

DOC = "docs/benchmarks/served.md"
TITLE = "MTAD and speculative sampling at request rates: goodput under a latency objective"
# requests/s between GuideLLM's two ends (one request at a time; all at once); on two cores the server carries
# about 1-2 of these 32-token answers a second
LOADS = "synchronous,0.5,1,2,4,throughput"
SLO = "ttft:1000;tpot:100"  # ms
ATTAINMENT = 0.9
TASK = "cnndm_mini"
SAMPLED = "do_sample=true,temperature=1.0,top_k=20,top_p=0.9"  # Appendix F


def collect(folder: Path, argv: list[str], limit: int, rounds: int, max_gen_toks: int, out: str) -> None:
    from mtad_vllm_bench import server_args

    from decodebench.commands.sweep import parse_levels, run_levels

    started = time.time()
    levels = parse_levels(None, LOADS, None, SLO)
    with serving(*server_args("context")) as base_url:
        produced = run_levels(
            "mtad",
            {"pretrained": "embedded", "mode": "mtad"},
            {"pretrained": "embedded"},
            base_url,
            levels,
            [TASK],
            Path(out).resolve(),
            rounds,
            limit,
            f"max_gen_toks={max_gen_toks},{SAMPLED}",
        )
    keep_sweep_runs(produced, folder)
    record_run(
        folder,
        __file__,
        argv,
        started,
        loads=LOADS,
        slo=SLO,
        attainment=ATTAINMENT,
        limit=limit,
        rounds=rounds,
        max_gen_toks=max_gen_toks,
        warm_up=True,
    )


def render(folder: Path) -> str:
    from decodebench.commands.sweep import markdown, read_levels, summarize

    run = load_json(folder, "run.json")
    summary = summarize(read_levels(folder))
    table = markdown(summary, "mtad", run["rounds"], run["attainment"])
    table = table.split("\n", 2)[2]  # the sweep's own title line left out: the page has its own
    lines = [
        *run_header(folder, TITLE, "served-rate-bench"),
        "One `decodebench serve` of the embedded model (vLLM's CPU build, bfloat16) drafting with vLLM's n-gram "
        "proposer (gamma = 4); `decodebench sweep` from one request at a time (synchronous) through open-loop "
        f"rates of {rates_text(run)} requests/s (Poisson arrivals, seeded) to every request at once (throughput), "
        f"{TASK} (n = "
        f"{run['limit']} real CNN/DailyMail articles, sampled as Appendix F: temperature 1, top-k 20, top-p 0.9, up "
        f"to {run['max_gen_toks']} new tokens, chat template); the baseline is vLLM's speculative sampling on the "
        "same drafts, the method MTAD's rule (tau 0.1). Objectives: "
        f"`{run['slo']}` (ms); attainment pooled over rounds with its Wilson interval, goodput in requests/s.",
        "",
        table.rstrip("\n"),
        "",
    ]
    return "\n".join(lines)


def rates_text(run: dict) -> str:
    return ", ".join(part for part in run["loads"].split(",") if part not in ("synchronous", "throughput"))


def main(argv: list[str] | None = None) -> int:
    return load_study_main(
        argv, __doc__, DOC, collect, render, limit=16, rounds=2, max_gen_toks=32, out="results/served-rate-bench"
    )


if __name__ == "__main__":
    raise SystemExit(main())
