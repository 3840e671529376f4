"""The one measurement layer every method and every baseline goes through.

A backend opens a ``Window`` around each unit of generation work it runs (a batch of rows on
the transformers backend, one ``LLM.generate`` call on vLLM); the window takes wall time and
energy. After the window closes, the backend records one ``RequestRecord`` per request that was
in it (``Window.record``). Methods never time themselves: they only add their own counters (``method_stats``).

Definitions (the README's "Measurements" section shows them to users):
- ``new_tokens``: tokens the model produced for the request, up to and including the token
  that ended it (EOS or the one completing a stop sequence); tokens generated past a stop only
  because other rows of the batch were still running are not counted.
- ``latency_s``: wall time of the window the request ran in (requests of one batch share it).
- ``tokens_per_second`` of a task: its new tokens over the summed wall time of its windows.
- ``joules_per_token``: metered joules of the task's windows over its new tokens. Energy is
  measured per window; a request's share is the window's joules per token times its tokens.
- ``repetition``: the LZ paper's degenerate-repetition check of each returned text (a unit
  repeated back to back at least 20 times, or a drifting loop; decodebench.metrics), so every
  generative task, lm-eval's own included, reports a ``degenerate_rate``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from decodebench.measure.energy import EnergyMeter
from decodebench.metrics.repetition import find_degenerate_repetition

FINISH_REASONS = ("eos", "stop", "length")


@dataclass
class RequestRecord:
    task: str
    doc_id: int
    request_index: int  # Instance.idx: position among the requests of one document
    prompt_tokens: int
    new_tokens: int
    finish_reason: str  # "eos", "stop" (a stop sequence) or "length" (hit max_gen_toks)
    latency_s: float
    batch_size: int
    ttft_s: float | None = None
    joules: float | None = None
    method_stats: dict[str, Any] = field(default_factory=dict)
    repetition: dict[str, Any] | None = None

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.latency_s if self.latency_s > 0 else None

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["tokens_per_second"] = self.tokens_per_second
        out["joules_per_token"] = self.joules / self.new_tokens if self.joules is not None and self.new_tokens else None
        return out


@dataclass
class Window:
    """Wall time and energy of one unit of generation work."""

    task: str
    started_at: float = 0.0  # time.perf_counter() when the window opened
    wall_s: float = 0.0
    joules: float | None = None
    ttft_s: float | None = None
    records: list[RequestRecord] = field(default_factory=list)

    def record(
        self,
        request,
        *,
        prompt_tokens: int,
        new_tokens: int,
        finish_reason: str,
        batch_size: int,
        ttft_s: float | None = None,
        method_stats: dict[str, Any] | None = None,
        text: str | None = None,
    ) -> RequestRecord:
        if finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {finish_reason!r}")
        rec = RequestRecord(
            task=request.task_name,
            doc_id=request.doc_id,
            request_index=request.idx,
            prompt_tokens=int(prompt_tokens),
            new_tokens=int(new_tokens),
            finish_reason=finish_reason,
            latency_s=self.wall_s,
            batch_size=batch_size,
            ttft_s=ttft_s if ttft_s is not None else self.ttft_s,
            method_stats=dict(method_stats or {}),
            repetition=find_degenerate_repetition(text).as_dict() if text is not None else None,
        )
        self.records.append(rec)
        self._attribute_energy()
        return rec

    def _attribute_energy(self) -> None:
        """Split the window's joules over its requests in proportion to their new tokens."""
        tokens = sum(r.new_tokens for r in self.records)
        for rec in self.records:
            if self.joules is None:
                rec.joules = None
            else:
                rec.joules = self.joules * rec.new_tokens / tokens if tokens else 0.0


class Recorder:
    """Collects windows and request records for one model instance."""

    def __init__(
        self,
        meter: EnergyMeter,
        synchronize: Callable[[], None] | None = None,
        summarize_method_stats: Callable[[list[RequestRecord]], dict] | None = None,
        summary_columns: Callable[[dict], dict] | None = None,
    ):
        self.meter = meter
        self._synchronize = synchronize or (lambda: None)
        self._summarize_method = summarize_method_stats or sum_numeric_stats
        self._summary_columns = summary_columns or (lambda stats: {})
        self.windows: list[Window] = []

    # -- measurement --------------------------------------------------------------------
    def open(self, task: str) -> _OpenWindow:
        return _OpenWindow(self, Window(task=task))

    def _finish(self, window: Window) -> None:
        self.windows.append(window)

    # -- results ------------------------------------------------------------------------
    @property
    def records(self) -> list[RequestRecord]:
        return [rec for window in self.windows for rec in window.records]

    def energy_status(self) -> dict[str, Any]:
        return {
            "available": self.meter.available,
            "source": self.meter.source,
            "devices": list(self.meter.devices),
            "unavailable_reason": self.meter.reason,
        }

    def task_summaries(self) -> dict[str, dict[str, Any]]:
        by_task: dict[str, list[Window]] = defaultdict(list)
        for window in self.windows:
            by_task[window.task].append(window)
        return {task: self._summarize(windows) for task, windows in sorted(by_task.items())}

    def _summarize(self, windows: list[Window]) -> dict[str, Any]:
        records = [rec for w in windows for rec in w.records]
        wall = sum(w.wall_s for w in windows)
        new_tokens = sum(r.new_tokens for r in records)
        ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
        joules = None if any(w.joules is None for w in windows) else sum(w.joules for w in windows)
        finish = {reason: sum(r.finish_reason == reason for r in records) for reason in FINISH_REASONS}
        checked = [r.repetition["degenerate"] for r in records if r.repetition is not None]
        method_stats = self._summarize_method(records)
        return {
            "requests": len(records),
            "prompt_tokens": sum(r.prompt_tokens for r in records),
            "new_tokens": new_tokens,
            "generate_seconds": wall,
            "tokens_per_second": new_tokens / wall if wall > 0 else None,
            "mean_latency_s": _mean(r.latency_s for r in records),
            "mean_ttft_s": _mean(ttfts) if ttfts else None,
            "finish_reasons": finish,
            "degenerate_rate": _mean(checked) if checked else None,
            "energy_joules": joules,
            "joules_per_token": joules / new_tokens if joules is not None and new_tokens else None,
            "energy_source": self.meter.source,
            "energy_unavailable_reason": self.meter.reason,
            "method": method_stats,
            # what a leaderboard shows of the method's statistics, chosen by the method itself
            "method_columns": self._summary_columns(method_stats),
        }

    def annotate_samples(self, samples: dict[str, list[dict]], indices: dict | None = None) -> None:
        """Add each request's measurements to lm-eval's logged samples (``--log_samples``)."""
        by_doc: dict[tuple[str, int], list[RequestRecord]] = defaultdict(list)
        for rec in self.records:
            doc_id = rec.doc_id
            if indices and rec.task in indices:  # lm-eval logs the true index under --samples
                doc_id = indices[rec.task][doc_id]
            by_doc[(rec.task, doc_id)].append(rec)
        for task, task_samples in samples.items():
            for sample in task_samples:
                found = by_doc.get((task, sample.get("doc_id")))
                if found:
                    found = sorted(found, key=lambda r: r.request_index)
                    sample["decodebench"] = [rec.as_json() for rec in found]


class _OpenWindow:
    def __init__(self, recorder: Recorder, window: Window):
        self._recorder, self.window = recorder, window

    def __enter__(self) -> Window:
        meter = self._recorder.meter
        self._recorder._synchronize()
        self._j0 = meter.read() if meter.available else None
        self.window.started_at = time.perf_counter()
        return self.window

    def __exit__(self, exc_type, exc, tb) -> None:
        self._recorder._synchronize()
        t1 = time.perf_counter()
        self.window.wall_s = t1 - self.window.started_at
        if self._j0 is not None:
            self.window.joules = self._recorder.meter.read() - self._j0
        if exc_type is None:
            self._recorder._finish(self.window)


def sum_numeric_stats(records: list[RequestRecord]) -> dict[str, Any]:
    """Default aggregation of method statistics: sum every numeric counter over the requests."""
    totals: dict[str, float] = defaultdict(float)
    for rec in records:
        for key, value in rec.method_stats.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[key] += value
    return dict(totals)


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return math.fsum(values) / len(values) if values else None
