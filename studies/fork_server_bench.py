"""What the fork server's preparation saves each ``lm_eval`` run forked from it (``decodebench.commands.runs``): the
seconds from a run's start to its end, on the embedded model, under three preparations; prints, it writes no page.

    python studies/fork_server_bench.py
    python studies/fork_server_bench.py --rounds 6 --runs 6

The preparations: the start-up imports alone (``STARTUP_IMPORTS``: torch, transformers, lm-eval; and the task index),
the imports every run makes once it loads its model and writes its table as well (``RUN_IMPORTS``), and both with
the server's objects frozen out of the garbage collector's sight (``PRELOAD``, what decodebench ships). Each round
runs all three, the order rotating from round to round; under each, a fresh Python starts a fork server so prepared,
runs one ``lm_eval`` run untimed (it waits for the server's imports) and then times ``--runs`` more, one after another.
Printed: each preparation's mean seconds a run over each later one's, with its 95% interval over rounds
(``decodebench.stats.round_ratio_interval``; above 1: the later preparation is faster).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time

SHIPPED = "startup + run imports, frozen"


def preparations() -> dict[str, list[str]]:
    from decodebench.commands.runs import FREEZE, PRELOAD, RUN_IMPORTS

    unfrozen = [module for module in PRELOAD if module != FREEZE]
    startup = [module for module in unfrozen if module not in RUN_IMPORTS]
    return {"startup imports": startup, "startup + run imports": unfrozen, SHIPPED: PRELOAD}


def run_seconds(preparation: str, runs: int, limit: int, out: str) -> list[float]:
    """In this process: a fork server prepared as ``preparation``, one untimed run, then ``runs`` timed runs."""
    from decodebench.commands import runs as lm_eval_runs
    from decodebench.data.embedded import ensure_embedded_model

    lm_eval_runs.PRELOAD = preparations()[preparation]
    arguments = ["--model", "baseline", "--model_args", f"pretrained={ensure_embedded_model()}"]
    arguments += ["--tasks", "squad_mini", "--limit", str(limit), "--gen_kwargs", "max_gen_toks=8"]
    arguments += ["--apply_chat_template", "--log_samples"]
    quiet = os.open(os.devnull, os.O_WRONLY)  # this Python's, closed as it exits
    seconds = []
    for number in range(runs + 1):
        started = time.perf_counter()
        process = lm_eval_runs.lm_eval_process(
            [*arguments, "--output_path", os.path.join(out, str(number))], stdout=quiet, stderr=quiet
        )
        if lm_eval_runs.wait(process) != 0:
            raise SystemExit(f"an lm_eval run under {preparation!r} failed (exit {process.exitcode})")
        if number:
            seconds.append(time.perf_counter() - started)
    return seconds


def measured(preparation: str, runs: int, limit: int) -> float:
    """A fresh Python's mean seconds a run under ``preparation``."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, __file__, "--child", preparation, "--runs", str(runs), "--limit", str(limit)]
        command += ["--out", out]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the runs under {preparation!r} failed (exit {done.returncode})")
    return statistics.mean(float(value) for value in done.stdout.split())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=6, help="rounds, the order rotating (default 6: each preparation first twice)"
    )
    parser.add_argument("--runs", type=int, default=4, help="timed runs under each preparation a round (default 4)")
    parser.add_argument("--limit", type=int, default=2, help="squad_mini documents a run (default 2)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(*run_seconds(args.child, args.runs, args.limit, args.out))
        return 0
    if args.rounds < 2 or args.runs < 1 or args.limit < 1:
        parser.error("--rounds must be at least 2 (an interval over rounds), --runs and --limit at least 1")
    from decodebench.stats import round_ratio_interval

    names = list(preparations())
    means = {name: [] for name in names}
    for number in range(1, args.rounds + 1):
        shift = (number - 1) % len(names)
        order = names[shift:] + names[:shift]
        seconds = {name: measured(name, args.runs, args.limit) for name in order}
        for name in names:
            means[name].append(seconds[name])
        print(f"round {number} ({' then '.join(order)}): " + ", ".join(f"{n} {seconds[n]:.2f} s" for n in names))
    print(
        f"{args.rounds} rounds of {args.runs} runs each (squad_mini, {args.limit} documents, the embedded model); "
        "mean seconds a run: " + ", ".join(f"{name} {statistics.mean(means[name]):.2f} s" for name in names)
    )
    # each preparation against each later one: what the run imports save, what freezing saves, what both save
    for slower, faster in itertools.combinations(names, 2):
        values = [slow / fast for slow, fast in zip(means[slower], means[faster], strict=True)]
        interval = round_ratio_interval(values)
        print(
            f"{slower} / {faster}: {statistics.geometric_mean(values):.2f}x [{interval.low:.2f}, {interval.high:.2f}] "
            f"(95% over rounds, n = {args.rounds})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
