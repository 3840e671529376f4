"""Reading lm-eval output folders: results JSON and samples logs into ``Run`` records.

Runs of decodebench's models carry their measurements in ``config.decodebench``; plain lm-eval
runs have none, and their speed and energy columns stay empty. Per-document metric values come
from the samples logs that ``--log_samples`` writes beside each results file; they give every
quality interval and every paired test. Anything missing, non-finite or not a number is recorded
(``Run.problems``, ``TaskResult.unread``) so that tables show it instead of passing an incomplete
run off as complete.
"""

from __future__ import annotations

import json
import lzma
import math
import sys
from dataclasses import dataclass, field
from functools import cached_property
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
}
# Breakdowns and descriptions that are not one number per task; tables leave them out.
SKIPPED_METRICS = {"infinigram_agreement_by_n", "infinigram_reference"}
# Metrics that are not a mean over documents (token-weighted), so no per-document interval applies.
TOKEN_WEIGHTED = {"infinigram_agreement"}
# lm-eval's results files, as it writes them and as the studies keep them under docs/data (xz-compressed)
RESULTS_PATTERNS = ("results_*.json", "results_*.json.xz")


def read_text(path: Path) -> str:
    """A results file's or samples log's text; a kept copy compressed with xz (``*.xz``) is read through lzma."""
    if path.suffix == ".xz":
        with lzma.open(path, "rt", encoding="utf-8") as handle:
            return handle.read()
    return path.read_text(encoding="utf-8")


def results_files(folder: Path, recursive: bool = True) -> list[Path]:
    """The lm-eval results files in ``folder`` (and below it), plain or kept compressed, in name order."""
    glob = Path(folder).rglob if recursive else Path(folder).glob
    return sorted(p for pattern in RESULTS_PATTERNS for p in glob(pattern))


def date_id(results: Path) -> str:
    """``results_2026-11-24T21-29-38.150909.json[.xz]`` -> ``2026-11-24T21-29-38.150909``: what names its samples."""
    return results.name.removesuffix(".xz").removesuffix(".json").removeprefix("results_")


def samples_log(results: Path, task: str) -> Path | None:
    """The samples log of ``task`` written beside a results file (plain or kept compressed), None without one."""
    for suffix in (".jsonl", ".jsonl.xz"):
        path = results.parent / f"samples_{task}_{date_id(results)}{suffix}"
        if path.is_file():
            return path
    return None


@dataclass
class TaskResult:
    name: str
    metrics: dict[str, float | None]  # metric name -> value (filter "none" or the first one); None: not finite
    higher_is_better: dict[str, bool]
    n: int | None
    measurement: dict[str, Any] | None  # decodebench's per-task statistics
    config: dict[str, Any]  # what must match for two runs of this task to be compared
    samples_file: Path | None
    unread: list[str] = field(default_factory=list)  # metrics whose value is not a number
    nonfinite: list[str] = field(default_factory=list)
    unreadable_samples: str | None = None  # why the samples log could not be read, once tried

    @property
    def primary_metric(self) -> str | None:
        for prefix, metric in PRIMARY_METRICS.items():
            if self.name.startswith(prefix) and metric in self.metrics:
                return metric
        return next((m for m in self.metrics if self.higher_is_better.get(m)), next(iter(self.metrics), None))

    @cached_property
    def per_document(self) -> dict[str, dict[tuple, float]]:
        """metric -> {(doc_id, doc_hash): value} from the samples log ({} without one, or when it is unreadable:
        ``unreadable_samples`` then says why)."""
        if self.samples_file is None:
            return {}
        values: dict[str, dict[tuple, float]] = {}
        seen_filter = None
        try:
            lines = read_text(self.samples_file).splitlines()
        except (OSError, UnicodeDecodeError, lzma.LZMAError, EOFError) as exc:
            self.unreadable_samples = f"{self.samples_file.name} cannot be read ({exc}): no intervals"
            return {}
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
            except json.JSONDecodeError as exc:
                self.unreadable_samples = (
                    f"{self.samples_file.name}:{number} is not valid JSON ({exc.msg}; a cut file?): no intervals "
                    "or paired tests for this task"
                )
                return {}
            if not isinstance(sample, dict):
                continue
            seen_filter = seen_filter or sample.get("filter")
            if sample.get("filter") != seen_filter:
                continue
            key = (sample.get("doc_id"), sample.get("doc_hash"))
            for metric in self.metrics:
                value = sample.get(metric)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    values.setdefault(metric, {})[key] = float(value)
        return values


@dataclass
class Run:
    path: Path
    model: str
    method: str
    method_args: dict[str, Any]
    method_label: str | None
    model_args: dict[str, Any]  # lm-eval's --model_args of the run, as recorded
    pretrained: str
    backend: str | None
    machine: dict[str, Any] | None
    energy: dict[str, Any] | None
    date: str | None
    git_hash: str | None
    batch_size: Any
    settings: dict[str, Any]  # run-level settings every comparison must share (limit, chat template, ...)
    tasks: dict[str, TaskResult]
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        args = ", ".join(f"{k}={printable(v)}" for k, v in self.method_args.items())
        backend = f" [{self.backend}]" if self.backend and self.backend != "hf" else ""
        return f"{self.method}{backend}" + (f" ({args})" if args else "")

    @property
    def measured(self) -> bool:
        return self.machine is not None

    @property
    def concurrency(self) -> int | None:
        """Requests in flight for a closed-loop served run (its ``num_concurrent``), None for in-process runs and
        open-loop ones."""
        if self.backend != "served" or self.request_rate is not None:
            return None
        try:
            return int(float(self.model_args.get("num_concurrent", 1)))
        except (TypeError, ValueError):
            return None

    @property
    def request_rate(self) -> float | None:
        """Requests per second offered to the server by an open-loop served run (its ``request_rate``), else None."""
        if self.backend != "served" or self.model_args.get("request_rate") is None:
            return None
        try:
            rate = float(self.model_args["request_rate"])
        except (TypeError, ValueError):
            return None
        return rate if math.isfinite(rate) and rate > 0 else None


def printable(value: Any) -> str:
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
            found = results_files(path)
            # a FIFO or device under that name would block the read for ever
            problems += [f"{p}: not a regular file; left out" for p in found if not p.is_file()]
            found = [p for p in found if p.is_file()]
            if not found:
                problems.append(f"{path}: no lm-eval results (results_*.json) in this folder")
            files += found
        else:
            problems.append(f"{path}: no such file or folder")
    return files, problems


def finite_number(value: int | float) -> bool:
    """Whether a number read from JSON is finite as a float: an integer beyond float's range (10^400 parses) is not,
    and ``math.isfinite`` would raise on it."""
    if isinstance(value, int):
        return abs(value) <= sys.float_info.max
    return math.isfinite(value)


def _finite(value: Any, where: str, found: list[str]) -> Any:
    """``value`` with every non-finite number replaced by None, its place noted in ``found``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not finite_number(value):
        found.append(where)
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{where}.{k}" if where else str(k), found) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v, f"{where}[{i}]", found) for i, v in enumerate(value)]
    return value


def _task_result(path: Path, data: dict, name: str, scores: dict, measurement: dict | None) -> TaskResult:
    metrics: dict[str, float | None] = {}
    unread, nonfinite = [], []
    for key, value in scores.items():
        if "," not in key or "_stderr" in key:
            continue
        metric = key.split(",", 1)[0]
        if metric in SKIPPED_METRICS or metric in metrics or metric in unread:
            continue
        if value is None:
            metrics[metric] = None
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            unread.append(metric)
        elif not finite_number(value):
            metrics[metric] = None
            nonfinite.append(metric)
        else:
            metrics[metric] = float(value)
    samples = samples_log(path, name)
    configs = (data.get("configs") or {}).get(name) or {}
    return TaskResult(
        name=name,
        metrics=metrics,
        higher_is_better=data.get("higher_is_better", {}).get(name, {}),
        n=(data.get("n-samples", {}).get(name) or {}).get("effective"),
        measurement=measurement,
        config={
            "generation_kwargs": configs.get("generation_kwargs"),
            "num_fewshot": (data.get("n-shot") or {}).get(name),
            "version": (data.get("versions") or {}).get(name),
        },
        samples_file=samples,
        unread=unread,
        nonfinite=nonfinite,
    )


def read_run(path: Path) -> Run:
    try:
        data = json.loads(read_text(path))
    except (OSError, UnicodeDecodeError, lzma.LZMAError, EOFError, json.JSONDecodeError) as exc:
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
        nonfinite: list[str] = []
        task = _task_result(path, data, name, scores, _finite(measurements.get(name), "", nonfinite))
        tasks[name] = task
        if nonfinite:
            problems.append(f"{name}: non-finite measurement(s) {', '.join(nonfinite[:5])}, shown as missing")
        if info and name not in measurements:
            problems.append(f"{name}: no decodebench measurement (the run may have been cut short)")
        if task.nonfinite:
            problems.append(f"{name}: non-finite value(s) for {', '.join(task.nonfinite)}, shown as missing")
        if task.unread:
            problems.append(f"{name}: not read (not a number): {', '.join(task.unread)}")
        if task.samples_file is None:
            problems.append(f"{name}: no samples log beside the results (run with --log_samples): no intervals")
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
        method_label=info.get("method_label"),
        model_args=model_args,
        pretrained=str(info.get("pretrained") or model_args.get("pretrained") or data.get("model_name") or "?"),
        backend=info.get("backend"),
        machine=info.get("machine"),
        energy=info.get("energy"),
        date=data.get("date") and str(data["date"]),
        git_hash=data.get("git_hash"),
        batch_size=config.get("batch_size"),
        settings={
            "limit": config.get("limit"),
            "gen_kwargs": config.get("gen_kwargs"),
            "chat_template": data.get("chat_template_sha"),
            "system_instruction": data.get("system_instruction_sha"),
            "fewshot_as_multiturn": data.get("fewshot_as_multiturn"),
        },
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
