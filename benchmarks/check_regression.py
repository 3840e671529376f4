"""Compare a pytest-benchmark run with the committed baseline; exit 1 on a regression.

    python benchmarks/check_regression.py NEW.json benchmarks/baseline.json [--tolerance 0.3]

On the machine the baseline was taken on (same CPU model and core count), medians are compared
directly. On another machine, each median is first divided by the calibration benchmark's median
of the same run, so that what is compared is the code's speed relative to the machine.
Refresh the baseline: ``tox -e bench`` then copy .tox/bench-latest.json to benchmarks/baseline.json.
"""

from __future__ import annotations

import argparse
import json
import sys

CALIBRATION = "test_calibration_matmul"


def medians(data: dict) -> dict[str, float]:
    return {bench["name"]: bench["stats"]["median"] for bench in data["benchmarks"]}


def machine(data: dict) -> tuple:
    info = data.get("machine_info", {})
    return (info.get("cpu", {}).get("brand_raw"), info.get("cpu", {}).get("count"), info.get("machine"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("new")
    parser.add_argument("baseline")
    parser.add_argument("--tolerance", type=float, default=0.3, help="allowed slowdown (0.3 = 30%%)")
    args = parser.parse_args(argv)
    with open(args.new) as handle:
        new = json.load(handle)
    with open(args.baseline) as handle:
        base = json.load(handle)
    new_m, base_m = medians(new), medians(base)
    same_machine = machine(new) == machine(base)
    scale_new = 1.0 if same_machine else new_m[CALIBRATION]
    scale_base = 1.0 if same_machine else base_m[CALIBRATION]
    mode = "absolute medians (same machine)" if same_machine else f"medians relative to {CALIBRATION}"
    print(f"comparing {mode}; tolerance {args.tolerance:.0%}")
    print(f"{'benchmark':50s} {'baseline':>12s} {'now':>12s} {'change':>8s}")
    regressions = []
    for name, value in sorted(new_m.items()):
        if name == CALIBRATION and not same_machine:
            continue
        if name not in base_m:
            print(f"{name:50s} {'(new)':>12s} {value:12.6f}")
            continue
        before, now = base_m[name] / scale_base, value / scale_new
        change = now / before - 1
        flag = "  REGRESSION" if change > args.tolerance else ""
        print(f"{name:50s} {before:12.6f} {now:12.6f} {change:+8.1%}{flag}")
        if flag:
            regressions.append(name)
    missing = sorted(set(base_m) - set(new_m))
    for name in missing:
        print(f"{name:50s} missing from this run")
    if regressions:
        print(f"{len(regressions)} regression(s) beyond {args.tolerance:.0%}: {', '.join(regressions)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
