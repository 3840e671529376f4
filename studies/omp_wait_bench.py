"""How OpenMP's wait policy changes torch's decoding when processes share the cores, as ``tox p`` runs the test
environments side by side (tox.ini sets ``OMP_WAIT_POLICY=PASSIVE`` for them); prints, it writes no page.

    python studies/omp_wait_bench.py                  # two processes at once, the tox p case
    python studies/omp_wait_bench.py --processes 1    # one process alone

Each round runs both policies, the order alternating from round to round (OpenMP's default first in odd rounds);
under a policy, ``--processes`` processes start together and each times ``--steps`` greedy decode steps of the
embedded model after a 200-token prompt. A round's ratio is the mean time under the default over the mean time with
waiting threads asleep (above 1: passive waits are faster); its 95% interval is over rounds
(``decodebench.stats.round_ratio_interval``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

POLICIES = ("default", "PASSIVE")


def decode_seconds(steps: int) -> float:
    """Seconds for ``steps`` greedy decode steps of the embedded model (model load and warm-up not counted)."""
    import torch
    from transformers import AutoModelForCausalLM

    from decodebench.data.embedded import ensure_embedded_model

    model = AutoModelForCausalLM.from_pretrained(ensure_embedded_model(), dtype=torch.float32).eval()
    prompt = torch.randint(0, 1000, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=4, do_sample=False)
        started = time.perf_counter()
        model.generate(prompt, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
    return time.perf_counter() - started


def run_policy(policy: str, processes: int, steps: int) -> list[float]:
    """Each process's decode seconds, all started together under ``policy``."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    command = [sys.executable, __file__, "--child", "--steps", str(steps)]
    started = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    times = []
    for process in started:
        out, _ = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"a decoding process under {policy} failed (exit {process.returncode})")
        times.append(float(out.strip().splitlines()[-1]))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds, the order alternating (default 4)")
    parser.add_argument("--processes", type=int, default=2, help="processes decoding at once (default 2)")
    parser.add_argument("--steps", type=int, default=64, help="decode steps each process times (default 64)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(decode_seconds(args.steps))
        return 0
    if args.rounds < 2 or args.processes < 1 or args.steps < 1:
        parser.error("--rounds must be at least 2 (an interval over rounds), --processes and --steps at least 1")
    from decodebench.stats import round_ratio_interval

    ratios, means = [], {policy: [] for policy in POLICIES}
    for number in range(1, args.rounds + 1):
        order = POLICIES if number % 2 else POLICIES[::-1]
        seconds = {policy: statistics.mean(run_policy(policy, args.processes, args.steps)) for policy in order}
        for policy in POLICIES:
            means[policy].append(seconds[policy])
        ratios.append(seconds["default"] / seconds["PASSIVE"])
        print(f"round {number} ({' then '.join(order)}): " + ", ".join(f"{p} {seconds[p]:.2f} s" for p in POLICIES))
    interval = round_ratio_interval(ratios)
    print(
        f"{args.processes} process(es) at once, {args.steps} decode steps each, {args.rounds} rounds: default "
        f"{statistics.mean(means['default']):.2f} s, passive {statistics.mean(means['PASSIVE']):.2f} s (means); "
        f"default / passive {statistics.geometric_mean(ratios):.2f}x [{interval.low:.2f}, {interval.high:.2f}] "
        f"(95% over rounds, n = {args.rounds})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
