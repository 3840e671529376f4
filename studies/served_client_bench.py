"""decodebench's served client against `vllm bench serve`, on a synthetic server whose timing is known exactly.

``tox -e served-client-bench`` (``python studies/served_client_bench.py``) serves OpenAI-compatible streamed
completions from the tests' own server (tests/fake_openai.py: aiohttp on loopback, one token per chunk, cumulative
``usage`` on each) and drives it with both clients, in rounds whose order alternates:

1. **timing**: the server waits 200 ms before the first chunk and 20 ms between chunks, 64 tokens per answer; at 1
   and 64 requests in flight, each client's p50 TTFT and TPOT against those known delays;
2. **ceiling**: the server answers at once; at 1, 16, 64 and 256 in flight, the requests/s and output tokens/s each
   client drives over 500 requests (decodebench: the task's requests over its wall time; vLLM: its
   ``request_throughput``), the ratio paired per round.

decodebench runs as a user runs it (``lm_eval --model baseline --model_args backend=served,...`` on squad_mini's
prompts, chat template); ``vllm bench serve`` on its random dataset of the embedded model's tokenizer (the prompts'
length does not matter to this server). The page is rendered from the data it keeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, doc_parser, keep_lm_eval_run, kept_results, load_json, page, record_run, run_header, save_json

DOC = "docs/benchmarks/served-client.md"
TITLE = "decodebench's served client against vllm bench serve on a synthetic server of known timing"
FIRST_S, GAP_S, TOKENS = 0.2, 0.02, 64
# every squad_mini prompt at 64 in flight: the first wave, which opens 64 connections and sends 64 requests at once,
# is an eighth of them, so that the p50 is a steady state's (the server's answers take the same time, so the closed
# loop's waves stay in step)
TIMING = {"levels": (1, 64), "requests": {1: 32, 64: 500}}
CEILING = {"levels": (1, 16, 64, 256), "requests": 500}
CLIENTS = ("decodebench", "vllm")


def fake_server(**timing):
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    from fake_openai import FakeOpenAI

    return FakeOpenAI(tokens=None, **timing)


def run_decodebench(base_url: str, level: int, requests: int, out: Path) -> Path:
    from decodebench.commands.runs import LmEvalRun

    return LmEvalRun(
        model="baseline",
        model_args={
            "backend": "served",
            "pretrained": "embedded",
            "base_url": base_url,
            "num_concurrent": str(level),
            "timeout": "1200",
        },
        tasks=["squad_mini"],
        output_path=out,
        limit=requests,
        gen_kwargs=f"max_gen_toks={TOKENS}",
    ).run_or_raise(f"decodebench at {level} in flight")


def run_vllm(base_url: str, level: int, requests: int, out: Path) -> Path:
    from decodebench.data.embedded import ensure_embedded_model

    out.mkdir(parents=True, exist_ok=True)
    command = [
        str(Path(sys.executable).with_name("vllm")),
        *("bench", "serve", "--backend", "openai", "--base-url", base_url.removesuffix("/v1")),
        *("--endpoint", "/v1/completions", "--model", "fake-model", "--tokenizer", str(ensure_embedded_model())),
        *("--dataset-name", "random", "--random-input-len", "200", "--random-output-len", str(TOKENS)),
        *("--num-prompts", str(requests), "--max-concurrency", str(level), "--request-rate", "inf"),
        *("--ignore-eos", "--disable-tqdm", "--save-result", "--result-dir", str(out)),
        *("--result-filename", "vllm-bench.json", "--percentile-metrics", "ttft,tpot,itl,e2el"),
    ]
    print(f"vllm bench serve at {level} in flight: " + " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return out / "vllm-bench.json"


def cores() -> tuple[set[int] | None, set[int]]:
    """The server's core and the clients' (the rest), where there are two or more: a client that shares the
    server's core delays the server's writes, and that delay would be counted as the client's error."""
    usable = sorted(os.sched_getaffinity(0))
    return ({usable[0]}, set(usable[1:])) if len(usable) > 1 else (None, set(usable))


def server_figures(timings: list[tuple[float, list[float]]]) -> dict:
    """What the server itself did for one run's requests: p50 over requests of its first write after arrival (its
    TTFT) and of the mean gap between its writes (its TPOT), in ms."""
    import statistics

    first = [written[0] - arrived for arrived, written in timings if written]
    gaps = [(w[-1] - w[0]) / (len(w) - 1) for _, w in timings if len(w) > 1]
    return {
        "requests": len(timings),
        "ttft_ms": 1000 * statistics.median(first),
        "tpot_ms": 1000 * statistics.median(gaps),
    }


def collect(folder: Path, argv: list[str], rounds: int, out: str) -> None:
    started = time.time()
    out_dir = Path(out).resolve()
    server_cores, client_cores = cores()
    for part, timing, levels in (
        ("timing", {"first_s": FIRST_S, "gap_s": GAP_S}, TIMING["levels"]),
        ("ceiling", {}, CEILING["levels"]),
    ):
        with fake_server(cpus=server_cores, **timing) as server:
            os.sched_setaffinity(0, client_cores)  # this thread, and the clients it starts
            for number in range(1, rounds + 1):
                for position, level in enumerate(levels if number % 2 else levels[::-1]):
                    requests = TIMING["requests"][level] if part == "timing" else CEILING["requests"]
                    order = CLIENTS if (number + position) % 2 else CLIENTS[::-1]
                    for client in order:
                        where = f"{part}/round-{number}/in-flight-{level}/{client}"
                        served_before = len(server.timings)
                        if client == "decodebench":
                            results = run_decodebench(server.base_url, level, requests, out_dir / where)
                            kept = keep_lm_eval_run(results, folder / where)
                            for samples in kept.parent.glob("samples_*.jsonl*"):  # 64 gaps x 500 requests: the
                                samples.unlink()  # page reads the task's figures alone
                        else:
                            found = json.loads(run_vllm(server.base_url, level, requests, out_dir / where).read_text())
                            save_json(folder / where, "vllm-bench.json", summary_of_vllm(found))
                        if part == "timing":  # vllm bench serve's one test request before its run is among these
                            save_json(folder / where, "server.json", server_figures(server.timings[served_before:]))
    os.sched_setaffinity(0, server_cores | client_cores if server_cores else client_cores)
    record_run(
        folder,
        __file__,
        argv,
        started,
        rounds=rounds,
        first_s=FIRST_S,
        gap_s=GAP_S,
        tokens=TOKENS,
        server_cores=sorted(server_cores or ()),
        client_cores=sorted(client_cores),
    )


VLLM_KEYS = (
    "completed",
    "duration",
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "p99_ttft_ms",
)


def summary_of_vllm(found: dict) -> dict:
    """What the page reads of vllm bench serve's result file (its per-request lists left out)."""
    return {key: found.get(key) for key in VLLM_KEYS}


def client_figures(where: Path) -> dict:
    """One run's figures, the same for both clients: requests, requests/s, output tokens/s, p50 TTFT and TPOT (ms)."""
    if (where / "vllm-bench.json").is_file():
        found = load_json(where, "vllm-bench.json")
        return {
            "requests": found["completed"],
            "requests_per_s": found["request_throughput"],
            "tokens_per_s": found["output_throughput"],
            "ttft_ms": found["median_ttft_ms"],
            "tpot_ms": found["median_tpot_ms"],
        }
    from decodebench.reports.reader import read_run

    task = read_run(kept_results(where)).tasks["squad_mini"].measurement
    seconds = task["generate_seconds"]
    return {
        "requests": task["requests"],
        "requests_per_s": task["requests"] / seconds,
        "tokens_per_s": task["new_tokens"] / seconds,
        "ttft_ms": 1000 * task["ttft_s"]["p50"],
        "tpot_ms": 1000 * task["tpot_s"]["p50"],
    }


def figures(folder: Path, part: str) -> dict[int, dict[str, list[dict]]]:
    """{level: {client: [figures per round]}}; a timing run's figures carry the server's own as ``server``."""
    found: dict[int, dict[str, list[dict]]] = {}
    for round_folder in sorted((folder / part).glob("round-*"), key=lambda p: int(p.name.split("-")[1])):
        for level_folder in round_folder.glob("in-flight-*"):
            level = int(level_folder.name.rsplit("-", 1)[1])
            for client in CLIENTS:
                where = level_folder / client
                figures = client_figures(where)
                if (where / "server.json").is_file():
                    figures["server"] = load_json(where, "server.json")
                found.setdefault(level, {}).setdefault(client, []).append(figures)
    return dict(sorted(found.items()))


def render(folder: Path) -> str:
    run = load_json(folder, "run.json")
    pinned = (
        f" The server's thread ran on core {run['server_cores']}, both clients on {run['client_cores']}."
        if run.get("server_cores")
        else ""
    )
    timing = figures(folder, "timing")
    own = all("server" in r for clients in timing.values() for rounds in clients.values() for r in rounds)
    lines = [
        *run_header(folder, TITLE, "served-client-bench"),
        "The tests' own OpenAI-compatible server on loopback (tests/fake_openai.py), "
        f"{run['tokens']} tokens per answer one per chunk, cumulative usage on each; both clients run against it in "
        "rounds whose order alternates "
        f"({run['rounds']} rounds). decodebench: `lm_eval --model baseline --model_args backend=served,...` on "
        "squad_mini's prompts; vLLM: `vllm bench serve --backend openai --dataset-name random --ignore-eos`." + pinned,
        "",
        f"**Timing** (the server writes the first chunk {1000 * run['first_s']:.0f} ms after a request arrives and "
        f"each next one {1000 * run['gap_s']:.0f} ms after the one before): p50 over each round's requests, then the "
        "mean over rounds; the error is against the known delay"
        + (
            ", and against what the server did (its own p50 over the same requests: when it wrote each chunk, by its "
            "clock, which the clients share), which leaves the client's part."
            if own
            else "."
        ),
        "",
        "| in flight | client | requests | TTFT p50 (ms) | error | TPOT p50 (ms) | error |"
        + (" server's TTFT, TPOT (ms) | client's TTFT, TPOT error against it (ms) |" if own else ""),
        "|---:|---|---:|---:|---:|---:|---:|" + ("---|---|" if own else ""),
    ]
    for level, clients in timing.items():
        for client, rounds in clients.items():
            ttft = _mean(rounds, "ttft_ms")
            tpot = _mean(rounds, "tpot_ms")
            row = (
                f"| {level} | {client} | {rounds[0]['requests']} | {ttft:.1f} | {ttft - 1000 * run['first_s']:+.1f} "
                f"| {tpot:.2f} | {tpot - 1000 * run['gap_s']:+.2f} |"
            )
            if own:
                server = [r["server"] for r in rounds]
                server_ttft, server_tpot = _mean(server, "ttft_ms"), _mean(server, "tpot_ms")
                row += f" {server_ttft:.1f}, {server_tpot:.2f} | {ttft - server_ttft:+.1f}, {tpot - server_tpot:+.2f} |"
            lines.append(row)
    lines += [
        "",
        "**Ceiling** (the server answers at once): requests/s and output tokens/s each client drives, the mean over "
        "rounds, and decodebench's over vLLM's per round.",
        "",
        "| in flight | decodebench req/s | vLLM req/s | decodebench tokens/s | vLLM tokens/s | ratio per round |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for level, clients in figures(folder, "ceiling").items():
        ours, theirs = clients["decodebench"], clients["vllm"]
        ratios = ", ".join(
            f"{a['requests_per_s'] / b['requests_per_s']:.2f}x" for a, b in zip(ours, theirs, strict=True)
        )

        lines.append(
            f"| {level} | {_mean(ours, 'requests_per_s'):.1f} | {_mean(theirs, 'requests_per_s'):.1f} "
            f"| {_mean(ours, 'tokens_per_s'):.0f} | {_mean(theirs, 'tokens_per_s'):.0f} | {ratios} |"
        )
    return "\n".join(lines) + "\n"


def _mean(rounds: list[dict], key: str) -> float:
    return sum(r[key] for r in rounds) / len(rounds)


def main(argv: list[str] | None = None) -> int:
    parser = doc_parser(__doc__, DOC)
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the order alternating (default 2)")
    parser.add_argument("--out", default="results/served-client-bench", help="the runs' output folder")
    args = parser.parse_args(argv)
    return page(args, argv, lambda folder, command: collect(folder, command, args.rounds, args.out), render)


if __name__ == "__main__":
    raise SystemExit(main())
