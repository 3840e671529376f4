"""The served backend trusts nothing a server sends: each way a server has misbehaved, with its exact input, against
a fake OpenAI-compatible server of the tests' own on loopback (tests/fake_openai.py). Runs without vLLM (py env)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import explain, fake_requests, results_files, run_lm_eval
from fake_openai import GOOD_TOKENS, FakeOpenAI

from decodebench.models.backends.served import ServedError


def served_lm(server: FakeOpenAI, tokenizer, method: str = "baseline", **args):
    from lm_eval.api.registry import get_model

    model_args = ",".join(
        f"{key}={value}" for key, value in {"backend": "served", "base_url": server.base_url, **args}.items()
    )
    return get_model(method).create_from_arg_string(f"{model_args},pretrained={tokenizer}")


@pytest.fixture()
def server():
    with FakeOpenAI() as fake:
        yield fake


@pytest.mark.parametrize(
    ("mode", "named"),
    [
        ("not json", "a stream chunk is not JSON: 'hello, this is not JSON'"),
        ("plain json", "answered a streamed request with application/json, not server-sent events"),
        ("negative usage", "usage.completion_tokens=-3: expected a whole number >= 0"),
        ("no usage", "the stream carried no usage"),
        ("inflated usage", "usage.completion_tokens=1500 for a request of max_tokens=4"),
        ("huge usage", "usage.completion_tokens=10000000000 for a request of max_tokens=4"),
        ("cut", "the stream ended before a finish reason (cut short), after 2 attempts"),
        ("redirect", "the server refused a request (HTTP 307 to http://192.0.2.1:9/v1/completions)"),
        ("endless line", "the stream is not server-sent events: a line longer than 1048576 bytes"),
        ("other choice", "a chunk of choice 1, where one completion (choice 0) was asked for"),
        ("text after finish", "the server sent text after the finish reason"),
        ("other model", "the stream answers for model 'other-model', not 'fake-model', the model asked for"),
        ("undercounted", "usage.completion_tokens=1 for 4 chunks of text: each chunk carries at least one token"),
        ("empty length", "finish_reason 'length' (max_tokens reached) with no token and no text"),
        ("huge prompt usage", "usage.prompt_tokens=1000000000000 for a prompt sent as"),
        (
            "stall",
            "no data from the server for 1 s (idle_timeout; comments and keep-alives do not count): the stream "
            "stalled after 1 chunks",
        ),
        ("bad status line", "sent a broken HTTP answer (ClientResponseError"),
    ],
)
def test_a_server_answer_that_is_not_a_whole_stream_is_a_named_error_for_that_request(
    server, tiny_checkpoint, mode, named
):
    lm = served_lm(server, tiny_checkpoint, max_retries=2, idle_timeout=1)
    server.mode = mode
    started = time.monotonic()
    with pytest.raises(ServedError) as caught:
        lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=4))
    assert named in str(caught.value)
    assert "the request for document 0" in str(caught.value) and "0 of 1 requests had been answered" in str(
        caught.value
    )
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("value", ["abc", -5, 0, True, 2**40, 2048.5])
def test_a_servers_max_model_len_is_checked_before_anything_is_sent(server, tiny_checkpoint, value):
    """The client cuts every prompt to fit what /v1/models claims: a claim that is no length stops the run, named."""
    server.model_len = value
    with pytest.raises(ServedError) as refused:
        served_lm(server, tiny_checkpoint)
    assert f"/v1/models gives max_model_len={value!r} for 'fake-model': expected a whole number of tokens in [1, " in (
        str(refused.value)
    )
    assert server.requests == 0


def test_prompts_cut_to_fit_the_servers_context_are_said_and_recorded(server, tiny_checkpoint, caplog):
    server.model_len = 6  # with 4 new tokens and lm-eval's one spare, room for one token of prompt
    lm = served_lm(server, tiny_checkpoint)
    (answer,) = lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=4))
    sent = len(server.payloads[-1]["prompt"][0])
    assert answer == " word" * 4 and sent == 1
    engine = lm.decodebench_recorder.task_summaries()["t"]["engine"]
    assert engine["prompts cut to fit max_model_len"] == 1 and engine["peak tokens cut from a prompt"] >= 4
    assert "1 of 1 prompts cut from the left by up to" in caplog.text and "a context of 6 tokens" in caplog.text
    server.model_len = 5  # no room at all
    lm = served_lm(server, tiny_checkpoint)
    with pytest.raises(
        ServedError,
        match=r"a context of 5 tokens \(max_model_len of .*\) leaves no room for a prompt before max_gen_toks=4",
    ):
        lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=4))


def test_the_peak_of_requests_in_flight_is_the_clients_own_count_over_any_window(tiny_checkpoint):
    """The server's gauges are read a second apart: a window shorter than that recorded a peak of 0."""
    with FakeOpenAI(mode="hold") as server:
        server.hold_until = 4  # every answer waits until 4 requests are in flight at once
        lm = served_lm(server, tiny_checkpoint, num_concurrent=4)
        lm.generate_until(fake_requests(["The capital of France is"] * 8, max_gen_toks=4))
        engine = lm.decodebench_recorder.task_summaries()["t"]["engine"]
        assert engine["peak client requests in flight"] == 4 == server.peak_in_flight


def test_a_warm_up_sends_the_tasks_first_requests_untimed_and_keeps_them_out_of_every_figure(server, tiny_checkpoint):
    lm = served_lm(server, tiny_checkpoint, warmup=2)
    prompts = ["The capital of France is", "Two and two make", "Paris is"]
    answers = lm.generate_until(fake_requests(prompts, max_gen_toks=4))
    assert answers == [" word" * 4] * 3 and server.requests == 5
    assert [p["prompt"] for p in server.payloads[:2]] == [p["prompt"] for p in server.payloads[2:4]]
    summary = lm.decodebench_recorder.task_summaries()["t"]
    assert summary["requests"] == 3 and summary["new_tokens"] == 12
    assert summary["engine"]["warm-up requests (untimed)"] == 2
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ValueError, match="untimed requests before each task's timed ones, a whole number >= 0"):
            served_lm(server, tiny_checkpoint, warmup=bad)


def test_a_transient_503_is_retried_and_counted(server, tiny_checkpoint):
    lm = served_lm(server, tiny_checkpoint)
    server.mode = "503 once"
    (answer,) = lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=8))
    assert answer == " word" * GOOD_TOKENS and server.requests == 2
    summary = lm.decodebench_recorder.task_summaries()["t"]
    assert summary["retries"] == 1 and summary["new_tokens"] == GOOD_TOKENS


def test_the_api_key_goes_with_every_call_and_into_no_result(tiny_checkpoint, monkeypatch):
    key = "sk-decodebench-test-0123456789"
    with FakeOpenAI(api_key=key) as server:
        with pytest.raises(ServedError, match=r"HTTP Error 401.*set OPENAI_API_KEY"):
            served_lm(server, tiny_checkpoint)
        monkeypatch.setenv("OPENAI_API_KEY", key)
        lm = served_lm(server, tiny_checkpoint)
        lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=8))
        paths = {call.get("Authorization") for call in server.headers[1:]}  # after the refused listing
        assert paths == {f"Bearer {key}"} and len(server.headers) >= 4  # models, metrics x2, the completion
        summaries = json.dumps([lm.get_model_info(), lm.decodebench_recorder.task_summaries()], default=str)
        assert key not in summaries


def test_a_backend_collected_inside_a_callers_event_loop_closes_its_connections(server, tiny_checkpoint):
    """The collector ran the backend's finalizer inside a running event loop (another test's asyncio code) and it
    raised there, leaving its HTTP session open."""
    import asyncio
    import gc
    import sys

    lm = served_lm(server, tiny_checkpoint)
    lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=4))
    session = lm._http["session"]
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append

    async def drop_it():
        nonlocal lm
        del lm
        gc.collect()

    try:
        asyncio.run(drop_it())
    finally:
        sys.unraisablehook = hook
    assert unraisable == [] and session.closed


def test_unreadable_server_counters_are_unavailable_and_do_not_hold_the_run(tiny_checkpoint, monkeypatch):
    from decodebench.measure import prometheus

    monkeypatch.setattr(prometheus, "SCRAPE_TIMEOUT_S", 0.5)  # the bound, shortened: what is tested is that it holds
    for metrics in ("nan", "trickle"):
        with FakeOpenAI(metrics=metrics) as server:
            lm = served_lm(server, tiny_checkpoint)
            started = time.monotonic()
            (answer,) = lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=8))
            assert answer == " word" * GOOD_TOKENS
            engine = lm.decodebench_recorder.task_summaries()["t"]["engine"]
            assert time.monotonic() - started < 20, metrics  # two scrapes of a page that never ends, bounded
            if metrics == "trickle":  # the client's own figures stay
                assert engine["unavailable"] == "the server's /metrics could not be read"
                assert engine["peak client requests in flight"] == 1 and "peak vllm:num_requests_running" not in engine
            else:  # the NaN gauge is left out, the rest read
                assert "peak vllm:num_requests_running" not in json.dumps(engine)


def test_lz_through_a_server_needs_no_vllm_on_the_client(server, tiny_checkpoint):
    import importlib.util

    assert importlib.util.find_spec("vllm") is None, "this test is for an environment without vLLM (tox -e py)"
    lm = served_lm(server, tiny_checkpoint, method="lz")
    (answer,) = lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=8))
    assert answer == " word" * GOOD_TOKENS
    assert server.payloads[-1]["vllm_xargs"]["lz_penalty"] == 0.15


def test_lm_eval_against_a_server_sending_garbage_fails_naming_it_and_keeps_nothing(
    server, embedded_checkpoint, tmp_path
):
    """A plain JSON answer to a streamed request: the old client scored an empty answer, exited 0 and cached it, so a
    rerun sent no request at all."""
    from sqlitedict import SqliteDict

    from decodebench.models.backends.base import CACHE_IDENTITY_KEY

    server.mode = "plain json"
    cache = tmp_path / "cache" / "lm"
    proc = run_lm_eval(
        *("--model", "baseline"),
        *("--model_args", f"backend=served,base_url={server.base_url},pretrained=embedded,max_retries=1"),
        *("--tasks", "squad_mini", "--limit", "2", "--gen_kwargs", "max_gen_toks=4"),
        *("--output_path", str(tmp_path / "out"), "--use_cache", str(cache)),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode != 0, explain(proc)
    assert "not server-sent events" in proc.stderr and "the request for document" in proc.stderr, explain(proc)
    assert results_files(tmp_path / "out") == []
    with SqliteDict(f"{cache}_rank0.db") as answers:
        assert set(answers) <= {CACHE_IDENTITY_KEY}  # no failed answer kept for a rerun to trust


def test_a_use_cache_written_through_one_server_does_not_answer_for_another(tiny_checkpoint):
    cache = {}  # lm-eval's --use_cache database, as check_shared_cache sees it
    with FakeOpenAI() as first, FakeOpenAI() as second:
        served_lm(first, tiny_checkpoint).check_shared_cache(cache, "cache.db")
        served_lm(first, tiny_checkpoint).check_shared_cache(cache, "cache.db")  # the same server again: fine
        with pytest.raises(ValueError, match=f"server.*{second.base_url.removesuffix('/v1')}"):
            served_lm(second, tiny_checkpoint).check_shared_cache(cache, "cache.db")


STUCK_SERVER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
if sys.argv[1] == "parent":  # as a vLLM server stuck starting: deaf to SIGINT, with an engine process of its own
    engine = subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[2]], stdout=subprocess.PIPE)
    engine.stdout.readline()
    print(engine.pid, flush=True)
else:
    print("ready", flush=True)
time.sleep(600)
"""


def test_a_server_deaf_to_sigint_is_stopped_with_every_process_it_started():
    import subprocess
    import sys

    from decodebench.commands.serve import stop_server

    server = subprocess.Popen([sys.executable, "-c", STUCK_SERVER, "parent", STUCK_SERVER], stdout=subprocess.PIPE)
    engine = int(server.stdout.readline())
    started = time.monotonic()
    stop_server(server, grace_s=1)
    assert server.returncode is not None and time.monotonic() - started < 30
    assert not running(engine)  # killing only the server left this one running


def running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, killed and not yet reaped by whoever inherited it, does not)."""
    import psutil

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # a SIGKILL lands within moments: wait for it, not for a time
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        time.sleep(0.05)
    return True
