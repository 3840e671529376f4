"""Leaderboard rows: quality, speed, the speed ratio to the baseline, energy and method statistics.

One row per run and task. The speed ratio divides a run's tokens/s by the tokens/s of the
``baseline`` run of the same model, backend and machine in the same report (ratios across
machines or models would compare hardware, not methods).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

from decodebench.measure.machine import short_name
from decodebench.reports.reader import Run, TaskResult


@dataclass
class Row:
    run: Run
    task: TaskResult
    tokens_per_second: float | None
    speed_ratio: float | None
    speed_note: str | None
    joules_per_token: float | None
    energy_note: str | None
    degenerate_rate: float | None
    method_summary: str

    @property
    def quality(self) -> float | None:
        metric = self.task.primary_metric
        return self.task.metrics.get(metric) if metric else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "task": self.task.name,
            "run": self.run.label,
            "method": self.run.method,
            "method_args": self.run.method_args,
            "model": self.run.pretrained,
            "backend": self.run.backend,
            "primary_metric": self.task.primary_metric,
            **{f"metric:{k}": v for k, v in self.task.metrics.items()},
            "tokens_per_second": self.tokens_per_second,
            "speed_ratio_vs_baseline": self.speed_ratio,
            "speed_note": self.speed_note,
            "joules_per_token": self.joules_per_token,
            "energy_note": self.energy_note,
            "degenerate_rate": self.degenerate_rate,
            "method_statistics": (self.task.measurement or {}).get("method"),
            "machine": machine_name(self.run),
            "results_file": str(self.run.path),
            "problems": self.run.problems,
        }


def machine_name(run: Run) -> str:
    return short_name(run.machine) if run.machine else "not recorded"


def _same_setup(a: Run, b: Run) -> bool:
    return a.pretrained == b.pretrained and a.backend == b.backend and machine_name(a) == machine_name(b)


def method_summary(task: TaskResult) -> str:
    """The columns the method chose for its statistics (``method_columns`` in the results)."""
    columns = (task.measurement or {}).get("method_columns") or {}
    parts = [
        f"{name} {_fmt(value, 2 if isinstance(value, float) and abs(value) >= 1 else 3)}"
        for name, value in columns.items()
    ]
    return ", ".join(parts) or "-"


def build_rows(runs: list[Run]) -> dict[str, list[Row]]:
    """Rows per task, tasks in first-seen order, rows by descending quality."""
    by_task: dict[str, list[Row]] = {}
    for run in runs:
        for task in run.tasks.values():
            measurement = task.measurement or {}
            speed = measurement.get("tokens_per_second")
            ratio, note = None, None
            if speed is None:
                note = "not measured" if not run.measured else "no tokens generated"
            else:
                baselines = [
                    other
                    for other in runs
                    if other.method == "baseline"
                    and _same_setup(other, run)
                    and task.name in other.tasks
                    and (other.tasks[task.name].measurement or {}).get("tokens_per_second")
                ]
                if baselines:
                    ratio = speed / baselines[0].tasks[task.name].measurement["tokens_per_second"]
                else:
                    note = "no baseline of this model and machine in the report"
            energy = measurement.get("joules_per_token")
            energy_note = None
            if energy is None:
                energy_note = measurement.get("energy_unavailable_reason") or (
                    "not measured (plain lm-eval run)" if not run.measured else "unavailable"
                )
            by_task.setdefault(task.name, []).append(
                Row(
                    run,
                    task,
                    speed,
                    ratio,
                    note,
                    energy,
                    energy_note,
                    measurement.get("degenerate_rate"),
                    method_summary(task),
                )
            )
    for rows in by_task.values():
        rows.sort(key=lambda row: (row.quality is None, -(row.quality or 0), row.run.label))
    return by_task


def metric_names(rows: list[Row]) -> list[str]:
    names: list[str] = []
    for row in rows:
        names += [m for m in row.task.metrics if m not in names]
    return names


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(by_task: dict[str, list[Row]], runs: list[Run], problems: list[str]) -> str:
    lines = ["# decodebench leaderboard", ""]
    machines = sorted({machine_name(run) for run in runs})
    lines += [f"- runs: {len(runs)}; machines: {'; '.join(machines)}"]
    revisions = sorted({run.git_hash for run in runs if run.git_hash})
    if revisions:
        lines.append(f"- git revisions: {', '.join(revisions)}")
    lines.append("")
    notes: list[str] = []
    for task, rows in by_task.items():
        metrics = metric_names(rows)
        lines += [f"## {task}", ""]
        header = ["run", *metrics, "tokens/s", "x baseline", "J/token", "loops", "method statistics", "model"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in rows:
            energy = _fmt(row.joules_per_token, 4)
            if row.energy_note:
                if row.energy_note not in notes:
                    notes.append(row.energy_note)
                energy = f"unavailable [{notes.index(row.energy_note) + 1}]"
            cells = [
                row.run.label,
                *(_fmt(row.task.metrics.get(m)) for m in metrics),
                _fmt(row.tokens_per_second, 1) if row.tokens_per_second is not None else (row.speed_note or "-"),
                f"{row.speed_ratio:.2f}x" if row.speed_ratio is not None else "-",
                energy,
                _fmt(row.degenerate_rate, 2),
                row.method_summary,
                row.run.pretrained.rsplit("/", 1)[-1],
            ]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        lines.append("")
    if notes:
        lines += ["Energy notes:", ""] + [f"{i}. {note}" for i, note in enumerate(notes, 1)] + [""]
    run_problems = [f"{run.path}: {p}" for run in runs for p in run.problems]
    if problems or run_problems:
        lines += ["Not complete or not read:", ""] + [f"- {p}" for p in problems + run_problems] + [""]
    return "\n".join(lines)


def csv_text(by_task: dict[str, list[Row]]) -> str:
    rows = [row.as_dict() for task_rows in by_task.values() for row in task_rows]
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in row.items()})
    return out.getvalue()


def json_text(by_task: dict[str, list[Row]], problems: list[str]) -> str:
    return json.dumps(
        {"tasks": {task: [row.as_dict() for row in rows] for task, rows in by_task.items()}, "problems": problems},
        indent=2,
        default=str,
    )
