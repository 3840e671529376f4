"""The vLLM backend, for real, on vLLM's CPU build (run with `tox -e vllm`)."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from conftest import console_script, explain, offline_env, read_results, read_samples, run_lm_eval

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.model]

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)

# Small engine footprint: several engines may share this machine's memory; eager mode skips
# the ~45 s torch.compile warm-up, which these tests do not measure.
ENGINE_ARGS = "gpu_memory_utilization=0.3,max_model_len=1024,enforce_eager=True"
# The engine core in the test's own process: its start takes ~7 s instead of ~32 s (two more
# processes importing torch and vLLM); what is tested does not depend on where the core runs.
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_lm_evals_own_vllm_model_still_works_on_the_cpu_build(embedded_checkpoint, tmp_path):
    out = tmp_path / "out"
    proc = run_lm_eval(
        "--model",
        "vllm",
        "--model_args",
        f"pretrained={embedded_checkpoint},{ENGINE_ARGS}",
        "--tasks",
        "squad_mini",
        "--limit",
        "2",
        "--output_path",
        str(out),
        cwd=tmp_path,
        **IN_PROCESS,
    )
    assert proc.returncode == 0, explain(proc)
    assert "decodebench" not in read_results(out)["config"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _post(url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_vllm_serve_switches_the_lz_penalty_on_per_request(embedded_checkpoint, tmp_path):
    """Installed, decodebench registers its processor with vLLM: `vllm serve` needs no flag, and
    an OpenAI-compatible request asks for the penalty through vllm_xargs."""
    port = _free_port()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (the server writes to it until the end)
    server = subprocess.Popen(
        [
            console_script("vllm"),
            *("serve", str(embedded_checkpoint), "--host", "127.0.0.1", "--port", str(port), "--seed", "0"),
            *("--gpu-memory-utilization", "0.3", "--max-model-len", "1024", "--enforce-eager"),
        ],
        env=offline_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as health:
                    if health.status == 200:
                        break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("vllm serve did not come up: " + (tmp_path / "server.log").read_text()[-4000:])

        def complete(**extra):
            prompt = {"model": str(embedded_checkpoint), "prompt": "Count from 1 to 30, then count again:"}
            return _post(
                f"{base}/v1/completions",
                {**prompt, "max_tokens": 40, "temperature": 0, **extra, "return_token_ids": True},
            )

        strong = {"lz_penalty": 100, "lz_codelength": "propositions"}  # forbids every token in the window
        authors = {"lz_penalty": 100, "lz_buffer": 1, "lz_window": 64}  # sources after the first token
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # mixed in one batch of the engine
            futures = [pool.submit(complete), pool.submit(complete, vllm_xargs=strong)]
            futures += [pool.submit(complete), pool.submit(complete, vllm_xargs=authors)]
            (s1, plain), (s2, penalized), (s3, plain_again), (s4, penalized_authors) = (f.result() for f in futures)
        assert (s1, s2, s3, s4) == (200, 200, 200, 200)
        plain_ids = plain["choices"][0]["token_ids"]
        assert len(set(plain_ids)) < len(plain_ids), "plain greedy counting repeats tokens"
        assert plain_again["choices"][0]["token_ids"] == plain_ids  # requests that do not ask are untouched
        ids = penalized["choices"][0]["token_ids"]
        assert len(ids) >= 30 and len(set(ids)) == len(ids)
        ids = penalized_authors["choices"][0]["token_ids"]  # only the very first token may come back, once
        assert len(ids) >= 30 and len(set(ids)) >= len(ids) - 1
        status, error = complete(vllm_xargs={"lz_penalty": -1})
        assert status == 400 and "strength=-1" in json.dumps(error)
        # a window and buffer that would cost seconds and gigabytes per step: refused, naming the argument
        status, error = complete(vllm_xargs={"lz_penalty": 0.1, "lz_window": 1e8, "lz_buffer": 1e7})
        assert status == 400 and "window=100000000: must be in [2, 4096]" in json.dumps(error)
        status, still = complete(vllm_xargs=authors)  # and the engine goes on serving
        assert status == 200 and len(still["choices"][0]["token_ids"]) >= 30
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def test_lz_model_runs_through_lm_eval_on_vllm_and_is_measured(embedded_checkpoint, tmp_path):
    out = tmp_path / "out"
    proc = run_lm_eval(
        *("--model", "lz", "--model_args", f"backend=vllm,pretrained=embedded,{ENGINE_ARGS}"),
        *("--tasks", "squad_mini", "--gen_kwargs", "max_gen_toks=12", "--limit", "6", "--batch_size", "auto"),
        *("--apply_chat_template", "--output_path", str(out), "--log_samples"),
        cwd=tmp_path,
        **IN_PROCESS,
    )
    assert proc.returncode == 0, explain(proc)
    info = read_results(out)["config"]["decodebench"]
    assert info["backend"] == "vllm" and info["method"] == "lz" and info["method_args"]["strength"] == 0.15
    stats = info["tasks"]["squad_mini"]
    assert stats["requests"] == 6 and stats["new_tokens"] > 0 and stats["tokens_per_second"] > 0
    assert stats["decoding"] == [{"do_sample": False}]
    samples = read_samples(out, "squad_mini")
    assert all(s["decodebench"][0]["new_tokens"] >= 1 for s in samples)
    assert sum(bool(s["resps"][0][0].strip()) for s in samples) >= 5, "vLLM should answer the questions"
    # greedy answers of this small model are stable enough to score at least one question right
    assert read_results(out)["results"]["squad_mini"]["normalized_accuracy,none"] > 0
