"""The shared measurement layer: windows, per-request records, task summaries, samples."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from decodebench.measure import Recorder
from decodebench.measure.energy import UnavailableMeter


class CountingMeter:
    """A meter whose counter advances by a fixed amount per read (deterministic energy)."""

    source = "rapl"
    reason = None
    available = True

    def __init__(self, joules_per_read, resolution_s=0.0):
        self.step, self.total = joules_per_read, 0.0
        self.devices = ["fake"]
        self.resolution_s = resolution_s

    def read(self):
        self.total += self.step
        return self.total

    def close(self):
        pass


def request(task, doc_id, idx=0):
    return SimpleNamespace(task_name=task, doc_id=doc_id, idx=idx)


def test_window_records_share_wall_time_and_split_energy_by_tokens():
    recorder = Recorder(CountingMeter(joules_per_read=6.0))
    with recorder.open("t") as window:
        pass
    window.record(request("t", 0), prompt_tokens=5, new_tokens=1, finish_reason="eos", batch_size=2)
    window.record(request("t", 1), prompt_tokens=7, new_tokens=2, finish_reason="length", batch_size=2)
    assert window.joules == pytest.approx(6.0)
    first, second = window.records
    assert first.latency_s == second.latency_s == window.wall_s > 0
    assert first.joules == pytest.approx(2.0) and second.joules == pytest.approx(4.0)
    summary = recorder.task_summaries()["t"]
    assert summary["requests"] == 2 and summary["new_tokens"] == 3 and summary["prompt_tokens"] == 12
    assert summary["joules_per_token"] == pytest.approx(2.0)
    assert summary["joules_per_total_token"] == pytest.approx(6.0 / 15)  # prompt + new tokens
    assert summary["finish_reasons"] == {"eos": 1, "stop": 0, "length": 1}
    assert summary["tokens_per_second"] == pytest.approx(3 / window.wall_s)


def test_unavailable_energy_stays_unavailable_with_its_reason():
    recorder = Recorder(UnavailableMeter("no counter here"))
    with recorder.open("t") as window:
        pass
    window.record(request("t", 0), prompt_tokens=1, new_tokens=4, finish_reason="stop", batch_size=1)
    summary = recorder.task_summaries()["t"]
    assert summary["energy_joules"] is None and summary["joules_per_token"] is None
    assert summary["energy_unavailable_reason"] == "no counter here"
    status = recorder.energy_status()
    assert status["available"] is False and status["source"] == "unavailable" and status["devices"] == []
    assert status["unavailable_reason"] == "no counter here" and "attribution" in status["attribution"]


def test_failed_window_is_not_recorded():
    recorder = Recorder(UnavailableMeter("x"))
    with pytest.raises(ZeroDivisionError), recorder.open("t"):
        1 / 0  # noqa: B018
    assert recorder.windows == []


def test_bad_finish_reason_is_rejected():
    recorder = Recorder(UnavailableMeter("x"))
    with recorder.open("t") as window:
        pass
    with pytest.raises(ValueError, match="finish_reason"):
        window.record(request("t", 0), prompt_tokens=1, new_tokens=1, finish_reason="done", batch_size=1)


def test_method_stats_are_summed_per_task_and_attached_to_samples():
    recorder = Recorder(UnavailableMeter("x"))
    with recorder.open("a") as window:
        pass
    window.record(
        request("a", 0),
        prompt_tokens=1,
        new_tokens=3,
        finish_reason="eos",
        batch_size=1,
        method_stats={"target_calls": 2, "label": "x"},
    )
    window.record(
        request("a", 1),
        prompt_tokens=1,
        new_tokens=5,
        finish_reason="eos",
        batch_size=1,
        method_stats={"target_calls": 3},
    )
    assert recorder.task_summaries()["a"]["method"] == {"target_calls": 5}

    samples = {"a": [{"doc_id": 1, "filter": "none"}, {"doc_id": 0, "filter": "none"}, {"doc_id": 7}]}
    recorder.annotate_samples(samples)
    assert samples["a"][0]["decodebench"][0]["new_tokens"] == 5
    assert samples["a"][1]["decodebench"][0]["method_stats"] == {"target_calls": 2, "label": "x"}
    assert "decodebench" not in samples["a"][2]

    # under --samples, lm-eval logs the true document index
    samples = {"a": [{"doc_id": 40}, {"doc_id": 30}]}
    recorder.annotate_samples(samples, indices={"a": [30, 40]})
    assert samples["a"][0]["decodebench"][0]["new_tokens"] == 5


def test_a_window_shorter_than_the_counters_resolution_is_flagged_never_zero_joules():
    recorder = Recorder(CountingMeter(joules_per_read=6.0, resolution_s=60.0))
    with recorder.open("t") as window:
        pass
    window.record(request("t", 0), prompt_tokens=5, new_tokens=4, finish_reason="eos", batch_size=1)
    assert window.joules is None and "shorter than the counter's resolution" in window.energy_flag
    summary = recorder.task_summaries()["t"]
    assert summary["energy_joules"] is None and summary["joules_per_token"] is None
    assert summary["energy_unmetered_windows"] == 1 and "never read as 0 J" in summary["energy_unmetered_reason"]
    frozen = Recorder(CountingMeter(joules_per_read=0.0))  # the counter did not move at all
    with frozen.open("t") as window:
        pass
    window.record(request("t", 0), prompt_tokens=5, new_tokens=4, finish_reason="eos", batch_size=1)
    assert window.joules is None and frozen.task_summaries()["t"]["joules_per_token"] is None


def test_latency_percentiles_time_per_output_token_and_a_speed_interval(monkeypatch):
    recorder = Recorder(UnavailableMeter("x"))
    for doc, tokens in enumerate([10, 20, 30, 40]):
        with recorder.open("t") as window:
            pass
        window.wall_s = tokens / 10  # 10 tokens/s each
        window.record(
            request("t", doc), prompt_tokens=1, new_tokens=tokens, finish_reason="length", batch_size=1, ttft_s=0.1
        )
    summary = recorder.task_summaries()["t"]
    assert summary["latency_s"] == {"p50": 2.5, "p90": pytest.approx(3.7), "p99": pytest.approx(3.97)}
    assert summary["ttft_s"]["p50"] == pytest.approx(0.1)
    # (latency - ttft) / (new tokens - 1): (1.0 - 0.1) / 9 = 0.1 for the first request
    assert summary["tpot_s"]["p50"] == pytest.approx(np.median([0.9 / 9, 1.9 / 19, 2.9 / 29, 3.9 / 39]))
    assert summary["tokens_per_second_interval"] == pytest.approx([10.0, 10.0])


def test_peak_resident_memory_grows_with_what_a_window_allocates():
    import mmap

    from decodebench.measure.memory import ResidentMemory

    recorder = Recorder(UnavailableMeter("x"), memory=ResidentMemory())
    with recorder.open("t") as window:
        # fresh pages from the kernel: a bytearray can reuse heap pages an earlier test left resident (it measured 0
        # growth after other tests, the definition's right answer for memory already held)
        block = mmap.mmap(-1, 80 * 2**20)
        for offset in range(0, len(block), mmap.PAGESIZE):  # touch every page
            block[offset] = 1
        block.close()
    assert window.peak_memory_bytes >= 70 * 2**20
    with recorder.open("t") as quiet:
        pass
    assert quiet.peak_memory_bytes < 20 * 2**20  # the peak starts again at every window


def test_requests_answered_from_lm_evals_cache_are_counted_apart():
    recorder = Recorder(UnavailableMeter("x"))
    with recorder.open("a") as window:
        pass
    window.record(request("a", 0), prompt_tokens=1, new_tokens=3, finish_reason="eos", batch_size=1)
    recorder.count_cached({"a": 3, "b": 2})
    summaries = recorder.task_summaries()
    assert summaries["a"]["requests"] == 1 and summaries["a"]["cached_requests"] == 2
    assert summaries["b"]["requests"] == 0 and summaries["b"]["cached_requests"] == 2
    assert summaries["b"]["tokens_per_second"] is None  # nothing was generated: no speed figure
