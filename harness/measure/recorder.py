"""The one measurement layer every method and every baseline goes through.

A backend opens a ``Window`` around each unit of generation work it runs (a batch of rows on
the transformers backend, one ``LLM.generate`` call on vLLM); the window takes wall time, energy
and peak memory. After the window closes, the backend records one ``RequestRecord`` per request
that was in it (``Window.record``). Methods never time themselves: they only add their own
counters (``method_stats``).

Definitions (docs/results.md shows them to users):
- ``new_tokens``: tokens the model produced for the request, up to and including the token
  that ended it (EOS or the one completing a stop sequence); tokens generated past a stop only
  because other rows of the batch were still running are not counted.
- ``latency_s``: wall time of the window the request ran in (requests of one batch share it), or the
  request's own where the backend sees it (a served request: sent to its last streamed chunk);
  ``ttft_s``: time to the first new token; ``tpot_s``: time per output token after the first,
  ``(latency - ttft) / (new_tokens - 1)``, the first token excluded; served requests also have
  ``chunk_gaps_s``, the raw gaps between the streamed chunks that carry text (ITL as vLLM defines
  it: ``itl_chunk_s``), and ``inter_token_s``, each gap divided by the tokens its chunk carries
  (per-token ITL: ``itl_s``; only where the server counts tokens on every chunk). A task reports
  their p50, p90 and p99 over requests (ITL over every interval).
- ``slo`` (served runs given objectives): the share of requests that met every objective (TTFT,
  TPOT, E2E latency), with its Wilson interval and n, and goodput: such requests per second of
  the task's wall time. ``load``: how the server was loaded (closed or open loop; the arrival
  schedule of an open one). ``spec_decode_per_request``: percentiles over requests of the acceptance
  length and rate a server reports per request (vLLM's ``--per-request-spec-decode-metrics``).
- ``engine`` (vLLM, in process or served): what the engine's own counters did over the task
  (speculative decoding's drafts and accepted tokens, prefix cache, the peak of running and waiting
  requests); methods read their statistics from it where the engine keeps them (MTAD on vLLM).
- ``tokens_per_second`` of a task: its new tokens over the summed wall time of its windows, with
  a 95% bootstrap interval over windows (one request each at batch size 1).
- ``peak_memory_bytes``: the largest window peak of the task (decodebench.measure.memory).
- ``joules_per_token``: metered joules of the task's windows over their new tokens, and
  ``joules_per_total_token`` over prompt plus new tokens. A request's ``joules`` is its window's
  energy split by new tokens: an attribution, not a measurement. A window shorter than the
  counter's resolution, or in which the counter did not move, is not metered: it is counted in
  ``energy_unmetered_windows`` and left out, never read as 0 J.
- ``decoding``: how the task's requests were decoded, as the backend ran them: greedy, or the
  temperature, top-k and top-p after every default (the method's, the model's, the library's).
- ``cached_requests``: requests lm-eval answered from its cache (``--use_cache``); they are not in
  any speed, latency, memory or energy figure.
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
from decodebench.measure.memory import MemoryMeter, NoMemory
from decodebench.measure.vllm_counters import mean_acceptance_length
from decodebench.metrics.repetition import find_degenerate_repetition
from decodebench.stats import percentiles, ratio_interval, wilson_interval

FINISH_REASONS = ("eos", "stop", "length")
ATTRIBUTION = "a request's joules are its window's energy split by new tokens (an attribution, not a measurement)"


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
    joules: float | None = None  # attributed by token share within the window
    method_stats: dict[str, Any] = field(default_factory=dict)
    repetition: dict[str, Any] | None = None
    decoding: dict[str, Any] | None = None  # decodebench.models.decoding.decoding_record
    inter_token_s: list[float] | None = None  # per generated token after the first (served requests)
    retries: int = 0  # attempts after the first (served requests: a transient failure retried)
    chunk_gaps_s: list[float] | None = None  # raw gaps between streamed chunks with text (served requests)
    sent_s: float | None = None  # when it was sent, in seconds from its window's start (served requests)
    spec_decode: dict[str, float] | None = None  # the server's own per-request acceptance (vLLM: served requests)

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.latency_s if self.latency_s > 0 else None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.new_tokens < 2:
            return None
        return max(0.0, self.latency_s - self.ttft_s) / (self.new_tokens - 1)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["tokens_per_second"] = self.tokens_per_second
        out["tpot_s"] = self.tpot_s
        out["joules_per_token"] = self.joules / self.new_tokens if self.joules is not None and self.new_tokens else None
        return out


@dataclass
class Window:
    """Wall time, energy and peak memory of one unit of generation work."""

    task: str
    started_at: float = 0.0  # time.perf_counter() when the window opened
    wall_s: float = 0.0
    joules: float | None = None  # None: not metered (no counter, or the window was too short)
    energy_flag: str | None = None  # why a window with a meter was not metered
    peak_memory_bytes: int | None = None
    ttft_s: float | None = None
    decoding: dict[str, Any] | None = None  # how it decoded (decodebench.models.decoding.decoding_record)
    engine: dict[str, Any] | None = None  # the inference engine's own counters over the window (vLLM's)
    load: dict[str, Any] | None = None  # how the server was loaded (served runs: models/backends/served_load.py)
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
        decoding: dict[str, Any] | None = None,
        latency_s: float | None = None,
        inter_token_s: list[float] | None = None,
        retries: int = 0,
        chunk_gaps_s: list[float] | None = None,
        sent_s: float | None = None,
        spec_decode: dict[str, float] | None = None,
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
            latency_s=self.wall_s if latency_s is None else latency_s,
            batch_size=batch_size,
            ttft_s=ttft_s if ttft_s is not None else self.ttft_s,
            method_stats=dict(method_stats or {}),
            repetition=find_degenerate_repetition(text).as_dict() if text is not None else None,
            decoding=decoding if decoding is not None else self.decoding,
            inter_token_s=inter_token_s,
            retries=int(retries),
            chunk_gaps_s=chunk_gaps_s,
            sent_s=sent_s,
            spec_decode=spec_decode,
        )
        self.records.append(rec)
        self._attribute_energy()
        return rec

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.records)

    @property
    def total_tokens(self) -> int:
        return sum(r.new_tokens + r.prompt_tokens for r in self.records)

    def _attribute_energy(self) -> None:
        """Split the window's joules over its requests in proportion to their new tokens."""
        tokens = self.new_tokens
        for rec in self.records:
            rec.joules = None if self.joules is None else (self.joules * rec.new_tokens / tokens if tokens else 0.0)


class Recorder:
    """Collects windows and request records for one model instance."""

    def __init__(
        self,
        meter: EnergyMeter,
        synchronize: Callable[[], None] | None = None,
        summarize_method_stats: Callable[[list[RequestRecord], dict | None], dict] | None = None,
        summary_columns: Callable[[dict], dict] | None = None,
        memory: MemoryMeter | None = None,
    ):
        self.meter = meter
        self.memory = memory or NoMemory("not measured")
        self._synchronize = synchronize or (lambda: None)
        self._summarize_method = summarize_method_stats or sum_numeric_stats
        self._summary_columns = summary_columns or (lambda stats: {})
        self.windows: list[Window] = []
        self.cached_requests: dict[str, int] = {}  # set after lm-eval's evaluate (--use_cache)
        self.slo: dict[str, float] | None = None  # {"ttft_s": limit, ...}: goodput is counted against it

    # -- measurement --------------------------------------------------------------------
    def open(self, task: str, decoding: dict[str, Any] | None = None) -> _OpenWindow:
        return _OpenWindow(self, Window(task=task, decoding=decoding))

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
            "resolution_s": getattr(self.meter, "resolution_s", None),
            "unavailable_reason": self.meter.reason,
            "attribution": ATTRIBUTION,
        }

    def memory_status(self) -> dict[str, Any]:
        return {"source": self.memory.source, "unavailable_reason": self.memory.reason}

    def task_summaries(self) -> dict[str, dict[str, Any]]:
        by_task: dict[str, list[Window]] = defaultdict(list)
        for window in self.windows:
            by_task[window.task].append(window)
        tasks = set(by_task) | set(self.cached_requests)
        return {task: self._summarize(task, by_task.get(task, [])) for task in sorted(tasks)}

    def _summarize(self, task: str, windows: list[Window]) -> dict[str, Any]:
        records = [rec for w in windows for rec in w.records]
        wall = sum(w.wall_s for w in windows)
        new_tokens = sum(r.new_tokens for r in records)
        finish = {reason: sum(r.finish_reason == reason for r in records) for reason in FINISH_REASONS}
        checked = [r.repetition["degenerate"] for r in records if r.repetition is not None]
        engine = _merge_engine(w.engine for w in windows if w.engine is not None)
        method_stats = self._summarize_method(records, engine)
        timed = [w for w in windows if w.wall_s > 0]
        summary = {
            "requests": len(records),
            "cached_requests": self.cached_requests.get(task, 0),
            "prompt_tokens": sum(r.prompt_tokens for r in records),
            "new_tokens": new_tokens,
            "generate_seconds": wall,
            "tokens_per_second": new_tokens / wall if wall > 0 else None,
            "tokens_per_second_interval": ratio_interval(
                [w.new_tokens for w in timed], [w.wall_s for w in timed]
            ).as_list()
            if len(timed) >= 2 and new_tokens
            else None,
            "tokens_per_second_units": len(timed),
            "latency_s": percentiles([r.latency_s for r in records]),
            "ttft_s": percentiles([r.ttft_s for r in records if r.ttft_s is not None]),
            "tpot_s": percentiles([r.tpot_s for r in records if r.tpot_s is not None]),
            "itl_s": percentiles([gap for r in records for gap in (r.inter_token_s or [])]),
            "itl_chunk_s": percentiles([gap for r in records for gap in (r.chunk_gaps_s or [])]),
            "mean_latency_s": _mean(r.latency_s for r in records),
            "mean_ttft_s": _mean(r.ttft_s for r in records if r.ttft_s is not None),
            "finish_reasons": finish,
            "retries": sum(r.retries for r in records),
            # every distinct way the task's requests were decoded, defaults included
            "decoding": _distinct(r.decoding for r in records if r.decoding is not None),
            "degenerate_rate": _mean(checked),
            "peak_memory_bytes": max(
                (w.peak_memory_bytes for w in windows if w.peak_memory_bytes is not None), default=None
            ),
            "memory_source": self.memory.source,
            **self._energy(windows),
            "engine": engine,
            "load": next((w.load for w in windows if w.load is not None), None),
            "spec_decode_per_request": _spec_decode_distribution(records),
            "slo": self._goodput(records, wall) if self.slo else None,
            "method": method_stats,
            # what a leaderboard shows of the method's statistics, chosen by the method itself
            "method_columns": self._summary_columns(method_stats),
        }
        return summary

    def _goodput(self, records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
        """The requests that met every objective: their share (Wilson interval, n) and their rate (DistServe's
        goodput, as vllm bench serve counts it). A request without the measure (TPOT of a one-token answer) is
        judged on the others."""
        met = sum(
            all(getattr(r, measure) is None or getattr(r, measure) <= limit for measure, limit in self.slo.items())
            for r in records
        )
        return {
            "objectives_s": dict(self.slo),
            "met": met,
            "n": len(records),
            "attainment": met / len(records) if records else None,
            "attainment_interval": wilson_interval(met, len(records)).as_list() if records else None,
            "goodput_rps": met / wall_s if wall_s > 0 else None,
        }

    def _energy(self, windows: list[Window]) -> dict[str, Any]:
        metered = [w for w in windows if w.joules is not None]
        joules = sum(w.joules for w in metered) if metered else None
        output_tokens = sum(w.new_tokens for w in metered)
        total_tokens = sum(w.total_tokens for w in metered)
        unmetered = [w for w in windows if w.joules is None and w.energy_flag]
        return {
            "energy_joules": joules,
            "joules_per_token": joules / output_tokens if joules is not None and output_tokens else None,
            "joules_per_total_token": joules / total_tokens if joules is not None and total_tokens else None,
            "energy_source": self.meter.source,
            "energy_devices": list(self.meter.devices),
            "energy_unavailable_reason": self.meter.reason,
            "energy_unmetered_windows": len(unmetered),
            "energy_unmetered_reason": unmetered[0].energy_flag if unmetered else None,
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

    def count_cached(self, requests_per_task: dict[str, int]) -> None:
        """Requests lm-eval sent for each task that never reached this model came from its cache."""
        generated = defaultdict(int)
        for rec in self.records:
            generated[rec.task] += 1
        for task, total in requests_per_task.items():
            if total > generated[task]:
                self.cached_requests[task] = total - generated[task]


class _OpenWindow:
    def __init__(self, recorder: Recorder, window: Window):
        self._recorder, self.window = recorder, window

    def __enter__(self) -> Window:
        recorder = self._recorder
        recorder._synchronize()
        recorder.memory.start()
        self._j0 = recorder.meter.read() if recorder.meter.available else None
        self.window.started_at = time.perf_counter()
        return self.window

    def __exit__(self, exc_type, exc, tb) -> None:
        recorder, window = self._recorder, self.window
        recorder._synchronize()
        window.wall_s = time.perf_counter() - window.started_at
        window.peak_memory_bytes = recorder.memory.peak_bytes()
        if self._j0 is not None:
            joules = recorder.meter.read() - self._j0
            resolution = getattr(recorder.meter, "resolution_s", 0.0)
            if window.wall_s < resolution or joules <= 0:
                window.energy_flag = (
                    f"a window of {window.wall_s:.3f} s, shorter than the counter's resolution ({resolution:.3f} s) "
                    "or with no counter change: not metered, never read as 0 J"
                )
            else:
                window.joules = joules
        if exc_type is None:
            recorder._finish(window)


def _spec_decode_distribution(records: list[RequestRecord]) -> dict[str, Any] | None:
    """Percentiles over requests of the server's per-request acceptance length and rate (None where it sent none)."""
    reported = [r.spec_decode for r in records if r.spec_decode]
    if not reported:
        return None
    return {
        "requests": len(reported),
        "mean_acceptance_length": percentiles([m["mean_acceptance_length"] for m in reported]),
        "draft_acceptance_rate": percentiles([m["draft_acceptance_rate"] for m in reported]),
    }


def sum_numeric_stats(records: list[RequestRecord], engine: dict | None = None) -> dict[str, Any]:
    """Default aggregation of method statistics: sum every numeric counter over the requests."""
    totals: dict[str, float] = defaultdict(float)
    for rec in records:
        for key, value in rec.method_stats.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[key] += value
    return dict(totals)


def _merge_engine(counters: Iterable[dict]) -> dict[str, Any] | None:
    """A task's engine counters over its windows: counters added up, peaks and ratios taken over all."""
    merged: dict[str, Any] = {}
    for window in counters:
        for name, value in window.items():
            if not isinstance(value, (int, float)):
                merged.setdefault(name, value)
            elif name.startswith("peak "):
                merged[name] = max(merged.get(name, value), value)
            elif name != "mean_acceptance_length":
                merged[name] = merged.get(name, 0) + value
    if (length := mean_acceptance_length(merged)) is not None:
        merged["mean_acceptance_length"] = length
    return merged or None


def _distinct(items: Iterable[dict]) -> list[dict]:
    out: list[dict] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return math.fsum(values) / len(values) if values else None
