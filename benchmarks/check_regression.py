"""Regression benchmarks of this tree against a baseline revision, both measured in the same run.

    python benchmarks/check_regression.py [--baseline REV] [--rounds 4] [--tolerance 0.3]

The baseline revision (default: the one named in benchmarks/BASELINE_REVISION) is checked out into a
temporary git worktree and laid out as the installed package would be (``decodebench`` and its
subpackages as links into the worktree); this tree is the package installed in the environment.
The same benchmark file (this tree's benchmarks/test_regression.py) runs against each, as whole
pytest-benchmark processes in rounds whose order alternates (baseline then tree, then tree then
baseline, ...). Per benchmark, the time of the tree over the baseline's is paired per round, with
its 95% bootstrap interval over rounds; a benchmark regresses when it is slower by more than the
tolerance and its interval lies above 1. Figures from another day or machine are never compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE_FILE = Path(__file__).with_name("BASELINE_REVISION")
# the repository's folders and where the wheel puts them (pyproject.toml, [tool.hatch.build.targets.wheel.sources])
PACKAGE_LAYOUT = {"models": "models", "kernels": "kernels", "tasks": "tasks", "reports": "reports"}


def baseline_revision() -> str:
    lines = [line.split("#")[0].strip() for line in BASELINE_FILE.read_text().splitlines()]
    return next(line for line in lines if line)


def package_of(worktree: Path, into: Path) -> Path:
    """``into/decodebench``: the worktree's harness/ files with models/, kernels/, tasks/, reports/ beside them,
    all as links, which is the layout the wheel installs."""
    package = into / "decodebench"
    package.mkdir(parents=True)
    for entry in (worktree / "harness").iterdir():
        (package / entry.name).symlink_to(entry)
    for folder, name in PACKAGE_LAYOUT.items():
        (package / name).symlink_to(worktree / folder)
    return into


def run_benchmarks(pythonpath: Path | None, out: Path, extra: list[str]) -> dict[str, float]:
    """Medians (s) of one pytest-benchmark run of this tree's benchmarks, against the package on ``pythonpath``
    (None: the installed one)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env.get('PYTHONPATH', '')}"
    command = [sys.executable, "-m", "pytest", str(REPO / "benchmarks"), "-q", "-p", "no:cacheprovider"]
    command += ["--benchmark-only", f"--benchmark-json={out}", *extra]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if not out.is_file():
        raise RuntimeError(f"the benchmarks did not run:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    data = json.loads(out.read_text())
    return {bench["name"]: bench["stats"]["median"] for bench in data["benchmarks"]}


def rounds_of(baseline: str, rounds: int, extra: list[str]) -> dict[str, dict[str, list[float]]]:
    """{benchmark: {"baseline": [median per round], "tree": [...]}}, the order alternating by round."""
    times: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="decodebench-bench-") as scratch:
        scratch = Path(scratch)
        worktree = scratch / "worktree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), baseline], check=True)
        try:
            sides = {"baseline": package_of(worktree, scratch / "baseline-package"), "tree": None}
            for number in range(rounds):
                for side in list(sides) if number % 2 == 0 else list(sides)[::-1]:
                    print(f"round {number + 1}/{rounds}: {side}", flush=True)
                    medians = run_benchmarks(sides[side], scratch / f"{side}-{number}.json", extra)
                    for name, median in medians.items():
                        times.setdefault(name, {"baseline": [], "tree": []})[side].append(median)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)
    return times


def verdicts(times: dict[str, dict[str, list[float]]], tolerance: float) -> tuple[list[str], list[str]]:
    """(a table line per benchmark, the names that regressed)."""
    from decodebench.stats import speed_ratio_interval

    lines = [f"{'benchmark':52s} {'tree / baseline time [95% CI]':>34s}", ""]
    regressed = []
    for name, sides in sorted(times.items()):
        if len(sides["baseline"]) != len(sides["tree"]) or not sides["tree"]:
            lines.append(f"{name:52s} {'not measured on both sides':>34s}")
            continue
        ones = [1.0] * len(sides["tree"])
        ratio, interval = speed_ratio_interval(ones, sides["baseline"], ones, sides["tree"])
        flag = ""
        if ratio > 1 + tolerance and interval.low > 1:
            flag = "  REGRESSION"
            regressed.append(name)
        lines.append(f"{name:52s} {ratio:10.3f}x [{interval.low:.3f}, {interval.high:.3f}]{flag}")
    return lines, regressed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=None, help=f"revision to compare with (default: {BASELINE_FILE.name})")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, the order alternating (default 4)")
    parser.add_argument("--tolerance", type=float, default=0.3, help="allowed slowdown (0.3 = 30%%)")
    parser.add_argument("--out", default=None, help="write the per-round medians here (JSON)")
    args, extra = parser.parse_known_args(argv)
    baseline = args.baseline or baseline_revision()
    print(f"this tree against {baseline}, {args.rounds} rounds in alternating order; tolerance {args.tolerance:.0%}")
    times = rounds_of(baseline, args.rounds, extra)
    if args.out:
        Path(args.out).write_text(json.dumps({"baseline": baseline, "times": times}, indent=1) + "\n")
    lines, regressed = verdicts(times, args.tolerance)
    print("\n".join(lines))
    if regressed:
        print(f"{len(regressed)} regression(s) beyond {args.tolerance:.0%}: {', '.join(regressed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
