"""The main job (README line 1): every method through the real ``lm_eval`` command, offline.

Each run is one ``lm_eval`` subprocess on the embedded model and the bundled mini tasks,
written to ``OUT/<run>/``; afterwards a short table of quality, tokens/s and J/token is printed
with the path of every results file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Run:
    name: str
    model: str
    model_args: str = ""


# Later methods add their runs here; every run is measured exactly like the baseline.
RUNS = [
    Run("baseline", "baseline"),
]
MINI_TASKS = ["facts_mini"]


def lm_eval_command(run: Run, tasks: list[str], out: Path, limit: int | None) -> list[str]:
    model_args = ",".join(arg for arg in ("pretrained=embedded", run.model_args) if arg)
    command = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        run.model,
        "--model_args",
        model_args,
        "--tasks",
        ",".join(tasks),
        "--batch_size",
        "1",
        "--output_path",
        str(out / run.name),
        "--log_samples",
    ]
    if limit is not None:
        command += ["--limit", str(limit)]
    return command


def newest_results(folder: Path, since: float) -> Path | None:
    found = [p for p in folder.glob("**/results_*.json") if p.stat().st_mtime >= since]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def offline_env() -> dict[str, str]:
    """Nothing may reach the Hugging Face hub during the demo: model and data are bundled."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_demo(
    out: str | Path = "results", limit: int | None = None, methods: str | None = None, tasks: str | None = None
) -> int:
    from decodebench.embedded import EmbeddedModelError, ensure_embedded_model

    out = Path(out).resolve()
    task_list = tasks.split(",") if tasks else MINI_TASKS
    runs = RUNS
    if methods:
        wanted = methods.split(",")
        unknown = sorted(set(wanted) - {run.name for run in RUNS})
        if unknown:
            print(f"error: unknown run(s) {unknown}; known: {[run.name for run in RUNS]}", file=sys.stderr)
            return 2
        runs = [run for run in RUNS if run.name in wanted]

    started = time.time()
    try:
        checkpoint = ensure_embedded_model(log=lambda msg: print(msg, flush=True))
    except EmbeddedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"embedded model: {checkpoint}", flush=True)

    produced: dict[str, Path | None] = {}
    for number, run in enumerate(runs, 1):
        command = lm_eval_command(run, task_list, out, limit)
        print(f"\n[{number}/{len(runs)}] {run.name}: {' '.join(command[1:])}", flush=True)
        run_started = time.time()
        returncode = subprocess.call(command, env=offline_env())
        produced[run.name] = newest_results(out / run.name, run_started) if returncode == 0 else None
        if returncode != 0:
            print(f"[{number}/{len(runs)}] {run.name} FAILED (exit code {returncode})", flush=True)

    print(summary_table(produced))
    print(f"\nfinished in {time.time() - started:.0f} s; results under {out}")
    return 0 if all(produced.values()) else 1


def summary_table(produced: dict[str, Path | None]) -> str:
    lines = ["", "| run | task | quality | tokens/s | J/token | results file |", "|---|---|---|---|---|---|"]
    reasons = set()
    for name, path in produced.items():
        if path is None:
            lines.append(f"| {name} | - | FAILED: no results | - | - | - |")
            continue
        results = json.loads(path.read_text())
        tasks = results.get("config", {}).get("decodebench", {}).get("tasks", {})
        for task, scores in results.get("results", {}).items():
            quality = ", ".join(
                f"{key.split(',')[0]} {value:.3f}"
                for key, value in scores.items()
                if "," in key and "_stderr" not in key and isinstance(value, (int, float))
            )
            speed = tasks.get(task, {})
            tps = speed.get("tokens_per_second")
            jpt = speed.get("joules_per_token")
            energy = f"{jpt:.3f}" if jpt is not None else "unavailable"
            if speed.get("energy_unavailable_reason"):
                reasons.add(speed["energy_unavailable_reason"])
            lines.append(
                f"| {name} | {task} | {quality} | {tps:.1f} | {energy} | {path} |"
                if tps is not None
                else f"| {name} | {task} | {quality} | - | {energy} | {path} |"
            )
    lines += [f"\nJ/token unavailable: {reason}" for reason in sorted(reasons)]
    return "\n".join(lines)
