"""Leaderboard rows: quality with intervals and paired tests, speed, memory, energy, method statistics.

One row per run and task. Every comparison is with the ``baseline`` run of the same model,
backend, machine and task configuration (the task's generation kwargs and few-shot count, the
run's ``--limit``, ``--gen_kwargs``, chat template and system instruction); speed ratios also need
the same batch size. A run with no such baseline, or without samples logs, says so instead of
showing a ratio or a test.

- quality: each metric's 95% interval from the samples log (Wilson with continuity correction for
  0/1 metrics, Student's t otherwise; which a metric is comes from its definition,
  decodebench.metrics.kinds), and against the baseline the paired difference on the documents both
  answered, an interval that agrees with its test, and the p-value (McNemar's exact test for 0/1
  metrics, the paired sign-flip permutation test otherwise; decodebench.stats); a difference with
  p < 0.05 is marked; below 10 documents intervals are marked approximate;
- speed: tokens/s with its bootstrap interval, the ratio to the baseline (two runs taken at different
  times: labelled "not interleaved", never marked significant; `decodebench compare` measures a
  paired one), latency, time to first token and time per output token percentiles;
- memory and energy: peak memory of generation, joules per output and per total token.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

from decodebench.measure.machine import short_name
from decodebench.metrics.kinds import is_binary_metric, metric_range
from decodebench.reports.reader import TOKEN_WEIGHTED, Run, TaskResult, printable
from decodebench.stats import APPROXIMATE_BELOW, paired_comparison, quality_interval

SIGNIFICANCE = 0.05
SMALL_N = 30
NOT_INTERLEAVED = "not interleaved"  # a ratio of two runs taken at different times


@dataclass
class MetricCell:
    value: float | None
    interval: list[float] | None = None
    interval_method: str | None = None  # "wilson", "bootstrap", or None with a reason
    comparison: dict[str, Any] | None = None  # paired difference against the baseline

    @property
    def significant(self) -> bool:
        return bool(self.comparison) and self.comparison["p_value"] < SIGNIFICANCE


@dataclass
class Row:
    run: Run
    task: TaskResult
    metrics: dict[str, MetricCell]
    baseline: Run | None
    baseline_note: str | None
    speed_ratio: float | None
    speed_note: str | None
    energy_note: str | None
    notes: list[str] = field(default_factory=list)
    label: str = ""  # the run's label, made unique within its task (distinguish_labels)

    def __post_init__(self):
        self.label = self.label or self.run.label

    @property
    def measurement(self) -> dict[str, Any]:
        return self.task.measurement or {}

    @property
    def quality(self) -> float | None:
        metric = self.task.primary_metric
        return self.metrics[metric].value if metric in self.metrics else None

    @property
    def n(self) -> int | None:
        return self.task.n

    @property
    def small_n(self) -> bool:
        return self.n is not None and self.n < SMALL_N

    @property
    def approximate(self) -> bool:
        """Below APPROXIMATE_BELOW documents an interval's coverage is only approximate."""
        return self.n is not None and self.n < APPROXIMATE_BELOW

    @property
    def tokens_per_second(self) -> float | None:
        return self.measurement.get("tokens_per_second")

    @property
    def joules_per_token(self) -> float | None:
        return self.measurement.get("joules_per_token")

    @property
    def method_summary(self) -> str:
        """The columns the method chose for its statistics (``method_columns`` in the results)."""
        columns = self.measurement.get("method_columns") or {}
        if not isinstance(columns, dict):
            return "-"
        parts = []
        for name, value in columns.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = _number(float(value), 2 if abs(value) >= 1 else 3)
            parts.append(f"{name} {'-' if value is None else printable(value)}")
        return ", ".join(parts) or "-"

    def as_dict(self) -> dict[str, Any]:
        m = self.measurement
        return {
            "task": self.task.name,
            "run": self.label,
            "method": self.run.method,
            "method_args": self.run.method_args,
            "model": self.run.pretrained,
            "backend": self.run.backend,
            "batch_size": self.run.batch_size,
            "concurrency": self.run.concurrency,
            "n": self.n,
            "n_below_30": self.small_n,
            "intervals_approximate": self.approximate,
            "primary_metric": self.task.primary_metric,
            "metrics": {
                name: {
                    "value": cell.value,
                    "interval": cell.interval,
                    "interval_method": cell.interval_method,
                    "vs_baseline": cell.comparison,
                }
                for name, cell in self.metrics.items()
            },
            "not_read": self.task.unread,
            "baseline": str(self.baseline.path) if self.baseline else None,
            "baseline_note": self.baseline_note,
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_second_interval": m.get("tokens_per_second_interval"),
            "speed_ratio_vs_baseline": self.speed_ratio,
            "speed_ratio_kind": NOT_INTERLEAVED if self.speed_ratio is not None else None,
            "speed_note": self.speed_note,
            "latency_s": m.get("latency_s"),
            "ttft_s": m.get("ttft_s"),
            "tpot_s": m.get("tpot_s"),
            "peak_memory_bytes": m.get("peak_memory_bytes"),
            "memory_source": m.get("memory_source"),
            "joules_per_token": self.joules_per_token,
            "joules_per_total_token": m.get("joules_per_total_token"),
            "energy_source": m.get("energy_source"),
            "energy_note": self.energy_note,
            "cached_requests": m.get("cached_requests"),
            "degenerate_rate": m.get("degenerate_rate"),
            "method_statistics": m.get("method"),
            "machine": machine_name(self.run),
            "results_file": str(self.run.path),
            "problems": self.run.problems,
            "notes": self.notes,
        }


def machine_name(run: Run) -> str:
    return short_name(run.machine) if run.machine else "not recorded"


def comparison_key(run: Run, task: TaskResult) -> tuple:
    """What two runs of a task must share to be compared on quality."""
    return (
        run.pretrained,
        run.backend,
        machine_name(run),
        task.name,
        json.dumps(task.config, sort_keys=True, default=str),
        json.dumps(run.settings, sort_keys=True, default=str),
        # how it was decoded after every default (a baseline sampling with top-k 50 is no baseline
        # for a method that samples with top-k 20)
        json.dumps((task.measurement or {}).get("decoding"), sort_keys=True),
        run.concurrency,  # a served run is compared at the same number of requests in flight
    )


def find_baseline(run: Run, task: TaskResult, runs: list[Run]) -> tuple[Run | None, str | None]:
    """The baseline run of the same configuration (the most recent if several), or why there is none."""
    if run.method == "baseline":
        return None, None
    key = comparison_key(run, task)
    matching = [
        other
        for other in runs
        if other.method == "baseline"
        and task.name in other.tasks
        and comparison_key(other, other.tasks[task.name]) == key
    ]
    if not matching:
        return None, (
            "no baseline of the same model, backend, machine and task configuration (generation kwargs, few-shot, "
            "--limit, chat template, decoding settings) in the report"
        )
    return max(matching, key=lambda other: other.date or ""), None


def metric_cells(task: TaskResult, baseline_task: TaskResult | None) -> tuple[dict[str, MetricCell], list[str]]:
    cells, notes = {}, []
    documents = task.per_document
    base_documents = baseline_task.per_document if baseline_task else {}
    notes += [t.unreadable_samples for t in (task, baseline_task) if t is not None and t.unreadable_samples]
    for metric, value in task.metrics.items():
        cell = MetricCell(value)
        values = documents.get(metric)
        binary = is_binary_metric(metric)
        if binary and values and any(v not in (0, 1) for v in values.values()):
            notes.append(f"{metric}: a 0/1 metric by its definition, but its values are not all 0 or 1: no interval")
            cells[metric] = cell
            continue
        if metric in TOKEN_WEIGHTED:
            cell.interval_method = "token-weighted: no per-document interval"
        elif values:
            interval, method = quality_interval(list(values.values()), binary, metric_range(metric))
            cell.interval, cell.interval_method = interval.as_list(), method
            base = base_documents.get(metric)
            if base:
                shared = sorted(set(values) & set(base), key=str)
                if shared and not (binary and any(base[k] not in (0, 1) for k in shared)):
                    cell.comparison = paired_comparison(
                        [values[k] for k in shared], [base[k] for k in shared], binary, metric_range(metric)
                    ).as_dict()
                if len(shared) < len(values):
                    notes.append(f"{metric}: {len(values) - len(shared)} document(s) not answered by the baseline")
        cells[metric] = cell
    return cells, notes


def build_rows(runs: list[Run]) -> dict[str, list[Row]]:
    """Rows per task, tasks in first-seen order, rows by descending quality."""
    by_task: dict[str, list[Row]] = {}
    for run in runs:
        for task in run.tasks.values():
            baseline, baseline_note = find_baseline(run, task, runs)
            cells, notes = metric_cells(task, baseline.tasks[task.name] if baseline else None)
            speed = (task.measurement or {}).get("tokens_per_second")
            ratio, speed_note = None, None
            if speed is None:
                speed_note = "not measured" if not run.measured else "no tokens generated"
            elif baseline is not None:
                base_speed = (baseline.tasks[task.name].measurement or {}).get("tokens_per_second")
                if baseline.batch_size != run.batch_size:
                    speed_note = f"the baseline ran at batch size {baseline.batch_size}, this run at {run.batch_size}"
                elif base_speed:
                    ratio = speed / base_speed
            elif run.method != "baseline":
                speed_note = "no matching baseline"
            by_task.setdefault(task.name, []).append(
                Row(
                    run=run,
                    task=task,
                    metrics=cells,
                    baseline=baseline,
                    baseline_note=baseline_note,
                    speed_ratio=ratio,
                    speed_note=speed_note,
                    energy_note=_energy_note(run, task),
                    notes=notes,
                )
            )
    for rows in by_task.values():
        distinguish_labels(rows)
        rows.sort(key=lambda row: (row.quality is None, -(row.quality or 0), row.label))
    return by_task


def distinguish_labels(rows: list[Row]) -> None:
    """Rows of one task whose runs read alike (same method and arguments) get what tells them apart: the model
    arguments, batch size and settings in which they differ, else their results file."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.run.label, []).append(row)
    for label, same in groups.items():
        if len(same) < 2:
            continue
        facts = [
            {**{k: str(v) for k, v in row.run.model_args.items()}, "batch_size": str(row.run.batch_size)}
            | {k: str(v) for k, v in row.run.settings.items() if v is not None}
            for row in same
        ]
        differing = sorted({k for f in facts for k in f if any(g.get(k) != f.get(k) for g in facts)})
        for row, fact in zip(same, facts, strict=True):
            detail = ", ".join(f"{k}={printable(fact.get(k, '-'))}" for k in differing) or row.run.path.name
            row.label = f"{label} [{detail}]"


def _energy_note(run: Run, task: TaskResult) -> str | None:
    measurement = task.measurement or {}
    if measurement.get("joules_per_token") is not None:
        unmetered = measurement.get("energy_unmetered_windows")
        return f"{unmetered} window(s) too short to meter were left out" if unmetered else None
    if not run.measured:
        return "not measured (plain lm-eval run)"
    return measurement.get("energy_unavailable_reason") or measurement.get("energy_unmetered_reason") or "unavailable"


def metric_names(rows: list[Row]) -> list[str]:
    names: list[str] = []
    for row in rows:
        names += [m for m in row.metrics if m not in names]
    return names


# -- formatting --------------------------------------------------------------------------------
def _number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def interval_text(cell: MetricCell) -> str:
    if cell.value is None:
        return "-"
    text = _number(cell.value)
    if cell.interval:
        text += f" [{_number(cell.interval[0])}, {_number(cell.interval[1])}]"
    return text


def bound_text(value: float | None) -> str:
    return f"{value:+.3f}" if value is not None and math.isfinite(value) else "unbounded"


def p_text(comparison: dict) -> str:
    """The p-value, with its resolution where the test sampled its permutations."""
    p, resolution = comparison["p_value"], comparison.get("resolution")
    if resolution and p <= resolution * 1.000001:
        return f"p<={resolution:.2g} (its resolution)"
    return f"p={p:.3g}"


def comparison_text(cell: MetricCell) -> str:
    """'+0.050* [+0.010, +0.090] p=0.012' (* when p < 0.05), or '-' without a paired baseline."""
    c = cell.comparison
    if not c:
        return "-"
    mark = "*" if cell.significant else ""
    low, high = c["interval"]
    return f"{c['difference']:+.3f}{mark} [{bound_text(low)}, {bound_text(high)}] {p_text(c)}"


def ratio_text(row: Row) -> str:
    if row.speed_ratio is None:
        return row.speed_note or "-"
    return f"{row.speed_ratio:.2f}x ({NOT_INTERLEAVED})"


def speed_interval(row: Row) -> list[float] | None:
    """The tokens/s bootstrap interval when it is worth showing: over fewer than APPROXIMATE_BELOW timed windows a
    bootstrap is not calibrated, so none is shown (results written before windows were counted keep theirs)."""
    units = row.measurement.get("tokens_per_second_units")
    if units is not None and units < APPROXIMATE_BELOW:
        return None
    return row.measurement.get("tokens_per_second_interval")


def speed_text(row: Row) -> str:
    tps = row.tokens_per_second
    if tps is None:
        return row.speed_note or "-"
    interval = speed_interval(row)
    return f"{tps:.1f}" + (f" [{interval[0]:.1f}, {interval[1]:.1f}]" if interval else "")


def speed_title(row: Row) -> str:
    """What a tokens/s cell's interval is, or why it has none."""
    if row.speed_note:
        return row.speed_note
    if speed_interval(row) is None and row.tokens_per_second is not None:
        units = row.measurement.get("tokens_per_second_units")
        return f"no interval: {units} timed batch(es), and below {APPROXIMATE_BELOW} a bootstrap is not calibrated"
    return "95% bootstrap interval over timed batches"


def percentiles_text(values: dict | None, scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return "-"
    return "/".join(
        _number(values.get(p) * scale if values.get(p) is not None else None, digits) for p in ("p50", "p90", "p99")
    )


def memory_text(row: Row) -> str:
    peak = row.measurement.get("peak_memory_bytes")
    return f"{peak / 2**20:.0f} MiB" if isinstance(peak, (int, float)) else "-"


def energy_text(row: Row, footnote: int | None = None) -> str:
    jpt = row.joules_per_token
    if jpt is None:
        return f"unavailable [{footnote}]" if footnote else "unavailable"
    total = row.measurement.get("joules_per_total_token")
    return f"{jpt:.4f} / {_number(total, 4)}"


def n_text(row: Row) -> str:
    if row.n is None:
        return "-"
    if row.approximate:
        return f"{row.n} (below {APPROXIMATE_BELOW}: intervals approximate)"
    return f"{row.n} (below {SMALL_N})" if row.small_n else str(row.n)


def markdown(by_task: dict[str, list[Row]], runs: list[Run], problems: list[str]) -> str:
    lines = ["# decodebench leaderboard", ""]
    machines = sorted({machine_name(run) for run in runs})
    lines += [f"- runs: {len(runs)}; machines: {'; '.join(machines)}"]
    revisions = sorted({run.git_hash for run in runs if run.git_hash})
    if revisions:
        lines.append(f"- git revisions: {', '.join(revisions)}")
    lines += [
        "- quality: value [95% interval: Wilson with continuity correction for 0/1 metrics, Student's t otherwise]; "
        "Δ: paired difference from the baseline of the same configuration [95% interval that agrees with the test] "
        "and p-value (McNemar's exact test for 0/1 metrics, the paired sign-flip permutation test otherwise); "
        "* marks p < 0.05; fewer than 6 pairs can never reach it (unbounded interval)",
        "- speed: tokens/s [95% bootstrap interval]; x baseline: ratio of two runs taken at different times "
        f"({NOT_INTERLEAVED}; `decodebench compare` measures interleaved, paired ratios); latency and TTFT "
        "p50/p90/p99 in s; TPOT p50/p90/p99 in ms; J/token: per output token / per prompt+output token",
        "",
    ]
    notes: list[str] = []
    for task, rows in by_task.items():
        metrics = metric_names(rows)
        primary = rows[0].task.primary_metric if rows else None
        lines += [f"## {task}", ""]
        header = [
            "run",
            "n",
            *metrics,
            f"Δ {primary} vs baseline",
            "tokens/s",
            "x baseline",
            "latency (s)",
            "TTFT (s)",
            "TPOT (ms)",
            "peak memory",
            "J/token",
            "loops",
            "method statistics",
        ]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in rows:
            footnote = None
            if row.energy_note and row.joules_per_token is None:
                if row.energy_note not in notes:
                    notes.append(row.energy_note)
                footnote = notes.index(row.energy_note) + 1
            primary_cell = row.metrics.get(primary) if primary else None
            delta = comparison_text(primary_cell) if primary_cell else "-"
            if delta == "-" and row.baseline_note:
                delta = "no matching baseline"
            cells = [
                row.label,
                n_text(row),
                *(interval_text(row.metrics[m]) if m in row.metrics else "-" for m in metrics),
                delta,
                speed_text(row),
                ratio_text(row),
                percentiles_text(row.measurement.get("latency_s")),
                percentiles_text(row.measurement.get("ttft_s")),
                percentiles_text(row.measurement.get("tpot_s"), 1000, 1),
                memory_text(row),
                energy_text(row, footnote),
                _number(row.measurement.get("degenerate_rate"), 2),
                row.method_summary,
            ]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        lines.append("")
    if notes:
        lines += ["Energy notes:", ""] + [f"{i}. {note}" for i, note in enumerate(notes, 1)] + [""]
    run_problems = [f"{run.path}: {p}" for run in runs for p in run.problems]
    if problems or run_problems:
        lines += ["Not complete or not read:", ""] + [f"- {p}" for p in problems + run_problems] + [""]
    return "\n".join(lines)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (strict JSON has no NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


# a text cell a spreadsheet would read as a formula (=, +, -, @; tab and carriage return as OWASP lists them)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """A value as a CSV cell: lists and dicts as JSON, and text a spreadsheet would run as a formula (a run's label
    comes from whoever wrote the results) behind a quote, as OWASP advises; numbers stay numbers."""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_text(by_task: dict[str, list[Row]]) -> str:
    rows = [finite(row.as_dict()) for task_rows in by_task.values() for row in task_rows]
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({key: csv_cell(value) for key, value in row.items()})
    return out.getvalue()


def json_text(by_task: dict[str, list[Row]], problems: list[str]) -> str:
    payload = {"tasks": {task: [row.as_dict() for row in rows] for task, rows in by_task.items()}, "problems": problems}
    return json.dumps(finite(payload), indent=2, default=str, allow_nan=False)
