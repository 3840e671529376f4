"""Reading lm-eval output folders: results JSON (and samples logs) into ``Run`` records.

Runs of decodebench's models carry their measurements in ``config.decodebench``; plain lm-eval
runs have none, and their speed and energy columns stay empty. Anything missing is recorded in
``Run.problems`` so that tables show it instead of passing an incomplete run off as complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The metric each task is plotted and ranked by (the papers' own); other tasks use their first
# higher-is-better metric.
PRIMARY_METRICS = {
    "squad": "normalized_accuracy",
    "spider": "execution_accuracy",
    "cnndm": "rougeLsum",
    "aime": "exact_match",
    "gpqa": "exact_match",
    "math_word": "exact_match",
    "facts": "normalized_accuracy",
}
# Metrics that are not single numbers (a breakdown) are left out of tables.
SKIPPED_METRICS = {"infinigram_agreement_by_n", "infinigram_reference"}


@dataclass
class TaskResult:
    name: str
    metrics: dict[str, float]  # metric name -> value (filter "none" or the first one)
    higher_is_better: dict[str, bool]
    samples: int | None
    measurement: dict[str, Any] | None  # decodebench's per-task statistics

    @property
    def primary_metric(self) -> str | None:
        for prefix, metric in PRIMARY_METRICS.items():
            if self.name.startswith(prefix) and metric in self.metrics:
                return metric
        return next((m for m in self.metrics if self.higher_is_better.get(m)), next(iter(self.metrics), None))


@dataclass
class Run:
    path: Path
    model: str
    method: str
    method_args: dict[str, Any]
    pretrained: str
    backend: str | None
    machine: dict[str, Any] | None
    energy: dict[str, Any] | None
    date: str | None
    git_hash: str | None
    tasks: dict[str, TaskResult]
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        args = ", ".join(f"{k}={_printable(v)}" for k, v in self.method_args.items())
        backend = f" [{self.backend}]" if self.backend and self.backend != "hf" else ""
        return f"{self.method}{backend}" + (f" ({args})" if args else "")

    @property
    def measured(self) -> bool:
        return self.machine is not None


def _printable(value: Any) -> str:
    """``str(value)`` with control characters escaped, so that split=\\n\\n keeps a table row on one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(value))


class NotResults(ValueError):
    """A JSON file that is not an lm-eval results file."""


def find_result_files(paths: list[str | Path]) -> tuple[list[Path], list[str]]:
    files, problems = [], []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            found = sorted(path.glob("**/results_*.json"))
            if not found:
                problems.append(f"{path}: no lm-eval results (results_*.json) in this folder")
            files += found
        else:
            problems.append(f"{path}: no such file or folder")
    return files, problems


def read_run(path: Path) -> Run:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise NotResults(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict) or "config" not in data:
        raise NotResults(f"{path}: not an lm-eval results file (no 'results' and 'config')")
    config = data["config"] or {}
    info = config.get("decodebench") or {}
    measurements = info.get("tasks", {})
    groups = set(data.get("group_subtasks", {}))
    tasks, problems = {}, []
    for name, scores in data["results"].items():
        if name in groups:
            continue
        metrics = {}
        for key, value in scores.items():
            if "," not in key or "_stderr" in key:
                continue
            metric = key.split(",", 1)[0]
            if metric in SKIPPED_METRICS or metric in metrics:
                continue
            metrics[metric] = value
        tasks[name] = TaskResult(
            name=name,
            metrics=metrics,
            higher_is_better=data.get("higher_is_better", {}).get(name, {}),
            samples=(data.get("n-samples", {}).get(name) or {}).get("effective"),
            measurement=measurements.get(name),
        )
        if info and name not in measurements:
            problems.append(f"{name}: no decodebench measurement (the run may have been cut short)")
    if not info:
        problems.append("plain lm-eval run: no speed or energy measurements")
    if not tasks:
        problems.append("no task results")
    model_args = config.get("model_args") or {}
    if isinstance(model_args, str):
        model_args = dict(pair.split("=", 1) for pair in model_args.split(",") if "=" in pair)
    return Run(
        path=path,
        model=str(config.get("model", "?")),
        method=info.get("method", str(config.get("model", "?"))),
        method_args=info.get("method_args", {}),
        pretrained=str(info.get("pretrained") or model_args.get("pretrained") or data.get("model_name") or "?"),
        backend=info.get("backend"),
        machine=info.get("machine"),
        energy=info.get("energy"),
        date=data.get("date") and str(data["date"]),
        git_hash=data.get("git_hash"),
        tasks=tasks,
        problems=problems,
    )


def read_runs(paths: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Every readable run under ``paths``, and a message for everything that could not be read."""
    files, problems = find_result_files(paths)
    runs = []
    for file in files:
        try:
            runs.append(read_run(file))
        except NotResults as exc:
            problems.append(str(exc))
    return runs, problems
