"""The shared measurement layer: windows, per-request records, task summaries, samples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from decodebench.measure import Recorder
from decodebench.measure.energy import UnavailableMeter


class CountingMeter:
    """A meter whose counter advances by a fixed amount per read (deterministic energy)."""

    source = "rapl"
    reason = None
    available = True

    def __init__(self, joules_per_read):
        self.step, self.total = joules_per_read, 0.0
        self.devices = ["fake"]

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
    assert recorder.energy_status() == {
        "available": False,
        "source": "unavailable",
        "devices": [],
        "unavailable_reason": "no counter here",
    }


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
