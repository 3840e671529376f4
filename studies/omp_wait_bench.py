"""How OpenMP's settings change torch's decoding when processes share the cores, as ``tox p`` runs the test
environments side by side (tox.ini sets ``OMP_WAIT_POLICY=PASSIVE`` and ``OMP_NUM_THREADS=1`` for them); prints, it
writes no page.

    python studies/omp_wait_bench.py                  # two processes at once, the tox p case
    python studies/omp_wait_bench.py --processes 1    # one process alone

Three settings: OpenMP's defaults (threads spin at barriers, one thread per core), waiting threads asleep
(``OMP_WAIT_POLICY=PASSIVE``), and asleep with one thread per process (``OMP_NUM_THREADS=1`` as well). Each round runs
all three, the order rotating from round to round; under a setting, ``--processes`` processes start together and
each times ``--steps`` greedy decode steps of the embedded model after a 200-token prompt. Two ratios per round: the
defaults' mean time over passive's (above 1: passive waits are faster), and passive's over passive with one thread
(above 1: one thread each is faster); each with its 95% interval over rounds
(``decodebench.stats.round_ratio_interval``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

# each setting: the OpenMP variables it sets (the others are taken out of the environment)
SETTINGS = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "passive, 1 thread": {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"},
}
# (numerator, denominator) of each ratio printed
RATIOS = (("default", "passive"), ("passive", "passive, 1 thread"))


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


def run_setting(setting: str, processes: int, steps: int) -> list[float]:
    """Each process's decode seconds, all started together under ``setting``."""
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env.update(SETTINGS[setting])
    command = [sys.executable, __file__, "--child", "--steps", str(steps)]
    started = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    times = []
    for process in started:
        out, _ = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"a decoding process under {setting} failed (exit {process.returncode})")
        times.append(float(out.strip().splitlines()[-1]))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=6, help="rounds, the order rotating (default 6: each setting first twice)"
    )
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

    names = list(SETTINGS)
    ratios = {pair: [] for pair in RATIOS}
    means = {name: [] for name in names}
    for number in range(1, args.rounds + 1):
        shift = (number - 1) % len(names)
        order = names[shift:] + names[:shift]
        seconds = {name: statistics.mean(run_setting(name, args.processes, args.steps)) for name in order}
        for name in names:
            means[name].append(seconds[name])
        for pair in RATIOS:
            ratios[pair].append(seconds[pair[0]] / seconds[pair[1]])
        print(f"round {number} ({' then '.join(order)}): " + ", ".join(f"{n} {seconds[n]:.2f} s" for n in names))
    print(
        f"{args.processes} process(es) at once, {args.steps} decode steps each, {args.rounds} rounds; means: "
        + ", ".join(f"{name} {statistics.mean(means[name]):.2f} s" for name in names)
    )
    for (top, bottom), values in ratios.items():
        interval = round_ratio_interval(values)
        print(
            f"{top} / {bottom}: {statistics.geometric_mean(values):.2f}x [{interval.low:.2f}, {interval.high:.2f}] "
            f"(95% over rounds, n = {args.rounds})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
