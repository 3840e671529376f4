"""Served load as serving benchmarks drive it: the open loop's arrival process (vllm bench serve's), goodput under
latency objectives, timing when a server counts tokens only at the end, and a client that never queues requests
itself. Against the tests' own server on loopback (tests/fake_openai.py); runs without vLLM."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import fake_requests
from fake_openai import GOOD_TOKENS, FakeOpenAI
from test_served_client import served_lm

from decodebench.models.backends.served_load import Load, arrival_times, parse_slo


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_arrivals_follow_vllm_bench_serves_gamma_process(burstiness):
    """Gaps of mean 1/rate and coefficient of variation 1/sqrt(burstiness): exponential (Poisson arrivals) at 1."""
    rate = 20.0
    arrivals = arrival_times(20_001, rate, burstiness, seed=7)
    gaps = np.diff(arrivals)
    assert arrivals[0] == 0 and np.all(gaps > 0)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)
    assert np.array_equal(arrivals, arrival_times(20_001, rate, burstiness, seed=7))  # seeded
    if burstiness == 1.0:  # exponential: P(gap > mean) = e^-1
        assert np.mean(gaps > 1 / rate) == pytest.approx(np.exp(-1), abs=0.02)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"num_concurrent": 4, "request_rate": 2}, "with request_rate=R, cap what is in flight with max_concurrency"),
        ({"burstiness": 0.5}, "burstiness and max_concurrency shape an open loop"),
        ({"request_rate": 0}, "request_rate=0: must be a finite number > 0"),
        ({"request_rate": "inf"}, "request_rate='inf': must be a finite number > 0"),
        ({"request_rate": 1, "burstiness": "nan"}, "burstiness='nan': must be a finite number > 0"),
        ({"request_rate": 1, "max_concurrency": 0}, "max_concurrency=0: must be a whole number >= 1"),
        ({"num_concurrent": 2.5}, "num_concurrent=2.5: must be a whole number >= 1"),
    ],
)
def test_a_load_that_cannot_be_run_is_named(args, message):
    full = {"num_concurrent": None, "request_rate": None, "burstiness": None, "max_concurrency": None, "seed": 0}
    with pytest.raises(ValueError, match=re.escape(message)):
        Load.from_args(**{**full, **args})


def test_objectives_read_as_vllm_goodput_names_them():
    assert parse_slo("ttft:500;tpot:50") == {"ttft_s": 0.5, "tpot_s": 0.05}
    assert parse_slo("e2el:2s ttft:250ms") == {"latency_s": 2.0, "ttft_s": 0.25}
    for bad, message in (("itl:50", "unknown objective 'itl'"), ("ttft:fast", "must be a number of ms"), ("", "at")):
        with pytest.raises(ValueError, match=message):
            parse_slo(bad)


def test_an_open_loop_run_records_its_schedule_and_never_sends_early(tiny_checkpoint):
    with FakeOpenAI() as server:
        lm = served_lm(server, tiny_checkpoint, request_rate=40, burstiness=0.5, slo="ttft:60000;tpot:60000")
        lm.generate_until(fake_requests([f"Question {i}:" for i in range(8)], max_gen_toks=8))
    summary = lm.decodebench_recorder.task_summaries()["t"]
    load = summary["load"]
    assert load["loop"] == "open" and load["request_rate"] == 40 and load["max_concurrency"] is None
    expected = arrival_times(8, 40, 0.5, seed=1234)
    assert load["arrivals_s"] == pytest.approx(expected.tolist())
    sent = sorted(r.sent_s for r in lm.decodebench_recorder.records)
    assert all(s >= a - 1e-3 for s, a in zip(sent, expected, strict=True))  # the timer may fire early by < 1 ms
    slo = summary["slo"]
    assert (slo["met"], slo["n"], slo["attainment"]) == (8, 8, 1.0) and slo["goodput_rps"] > 0
    assert slo["attainment_interval"][1] == 1.0 and slo["attainment_interval"][0] < 1.0


def test_the_open_loops_highest_rate_sends_every_request_at_once(tiny_checkpoint):
    """A sweep's throughput end (request_rate at its highest): the server answers only once all are in flight."""
    from decodebench.models.backends.served_load import MAX_REQUEST_RATE

    with FakeOpenAI(mode="hold") as server:
        server.hold_until = 6
        lm = served_lm(server, tiny_checkpoint, request_rate=MAX_REQUEST_RATE)
        lm.generate_until(fake_requests([f"Question {i}:" for i in range(6)], max_gen_toks=4))
    assert server.peak_in_flight == 6
    assert max(lm.decodebench_recorder.task_summaries()["t"]["load"]["arrivals_s"]) < 1e-3


def test_goodput_counts_only_requests_within_every_objective(tiny_checkpoint):
    with FakeOpenAI() as server:
        lm = served_lm(server, tiny_checkpoint, num_concurrent=2, slo="ttft:0.001;e2el:60s")  # 1 µs: none meets it
        lm.generate_until(fake_requests([f"Question {i}:" for i in range(4)], max_gen_toks=8))
    slo = lm.decodebench_recorder.task_summaries()["t"]["slo"]
    assert slo["objectives_s"] == {"ttft_s": 1e-6, "latency_s": 60.0}
    assert (slo["met"], slo["attainment"], slo["goodput_rps"]) == (0, 0.0, 0.0)


def test_a_server_counting_tokens_only_at_the_end_still_gets_ttft_and_chunk_gaps(tiny_checkpoint):
    """OpenAI's API without continuous usage: the old client took the whole request as TTFT and saw no ITL."""
    with FakeOpenAI(mode="usage at end", gap_s=0.02) as server:
        lm = served_lm(server, tiny_checkpoint)
        (answer,) = lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=8))
    (record,) = lm.decodebench_recorder.records
    assert answer == " word" * GOOD_TOKENS and record.new_tokens == GOOD_TOKENS
    assert record.ttft_s < record.latency_s  # the first text chunk, not the usage at the end
    assert len(record.chunk_gaps_s) == GOOD_TOKENS - 1  # one gap between each two chunks of text
    assert record.inter_token_s is None and record.tpot_s is not None  # per token unknown; TPOT from the totals
    summary = lm.decodebench_recorder.task_summaries()["t"]
    assert summary["itl_chunk_s"]["p50"] > 0
    # what the server did, the truth the served-client benchmark measures clients against: each chunk of text
    # written no earlier than its schedule, and the client saw no gap the server did not make
    ((arrived, written),) = server.timings
    assert len(written) == GOOD_TOKENS
    assert all(at >= arrived + 0.02 * number - 1e-3 for number, at in enumerate(written))
    assert record.ttft_s >= written[0] - arrived - 1e-3


def test_more_than_a_hundred_requests_are_in_flight_when_asked(tiny_checkpoint):
    """aiohttp's default connection limit (100) queued the rest inside the client, counted as their TTFT."""
    with FakeOpenAI(mode="hold") as server:
        server.hold_until = 150
        lm = served_lm(server, tiny_checkpoint, num_concurrent=150)
        lm.generate_until(fake_requests([f"Question {i}:" for i in range(150)], max_gen_toks=4))
        assert server.peak_in_flight == 150


def test_per_request_acceptance_a_server_reports_lands_in_samples_and_results(tiny_checkpoint):
    with FakeOpenAI(mode="spec metrics") as server:
        lm = served_lm(server, tiny_checkpoint, num_concurrent=2)
        lm.generate_until(fake_requests([f"Question {i}:" for i in range(3)], max_gen_toks=8))
    assert {r.spec_decode["mean_acceptance_length"] for r in lm.decodebench_recorder.records} == {2.5}
    per_request = lm.decodebench_recorder.task_summaries()["t"]["spec_decode_per_request"]
    assert per_request["requests"] == 3 and per_request["draft_acceptance_rate"]["p50"] == 0.375
