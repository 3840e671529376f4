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
    ],
)
def test_a_server_answer_that_is_not_a_whole_stream_is_a_named_error_for_that_request(
    server, tiny_checkpoint, mode, named
):
    lm = served_lm(server, tiny_checkpoint, max_retries=2)
    server.mode = mode
    started = time.monotonic()
    with pytest.raises(ServedError) as caught:
        lm.generate_until(fake_requests(["The capital of France is"], max_gen_toks=4))
    assert named in str(caught.value)
    assert "the request for document 0" in str(caught.value) and "0 of 1 requests had been answered" in str(
        caught.value
    )
    assert time.monotonic() - started < 30


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
            if metrics == "trickle":
                assert engine == {"unavailable": "the server's /metrics could not be read"}
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
