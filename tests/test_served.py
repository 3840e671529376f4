"""The served backend against a real `vllm serve` (vLLM's CPU build) over loopback, started by `decodebench serve`.

One plain server is shared by the module; a second one (both start together, at the module's first test),
speculating with a draft model in bfloat16 (what GPU users serve), shows chunks that carry several tokens, verifies
MTAD's and block verification's requests by their rules (structured outputs among them), and is killed mid-run at
the end.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from conftest import (
    STRONG_LZ,
    VLLM_LIMIT,
    VLLM_MAX_GEN_TOKS,
    Lines,
    console_script,
    decodebench_in_process,
    explain,
    lm_eval_in_process,
    offline_env,
    read_results,
    read_samples,
    results_files,
    run_command,
    run_lm_eval,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.model]

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)

# float32 on both sides: in bfloat16 a batch of another size flips a near-tie of greedy decoding now and then
SERVER_ARGS = ("--max-model-len", "1024", "--enforce-eager", "--seed", "0")
FLOAT32 = ("--dtype", "float32")
# as the in-process engine's shared runs (conftest.vllm_run), whose answers these are compared with
LIMIT = str(VLLM_LIMIT)
SHORT = ("--gen_kwargs", f"max_gen_toks={VLLM_MAX_GEN_TOKS}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# The process layout vLLM gives one GPU: the API server, and the engine core with its worker in the same process
# (vLLM's "uni" executor). On CPU vLLM otherwise puts the worker in a third process ("mp"), which imports torch and
# vLLM again and, after each step it reads, spins on the shared-memory queue for a second; with multiprocessing off
# the CPU build keeps "uni", and a server's engine core is still a process of its own (AsyncLLM always starts one).
# The stop-while-starting test starts servers in the CPU build's default layout.
ONE_DEVICE_LAYOUT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


class Server:
    def __init__(self, tmp_path, *extra: str):
        self.port = _free_port()
        self.log_path = tmp_path / f"server-{self.port}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 (written until the server stops)
        command = [console_script("decodebench"), "serve", "--port", str(self.port), *SERVER_ARGS, *extra]
        self.process = subprocess.Popen(
            command,
            env=offline_env(**ONE_DEVICE_LAYOUT),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def ready(self) -> Server:
        """Once the server says what to run (its engine is up); a server that dies or never comes up fails the test."""
        deadline = time.monotonic() + 600
        while "lm_eval --model baseline --model_args backend=served" not in self.output():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("decodebench serve did not come up:\n" + self.output()[-4000:])
            time.sleep(1)  # polls the log for the line; the wait ends on the line, not on the time
        return self

    def output(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()

    def kill(self) -> None:
        """The whole server at once, as a crash or an OOM kill takes it: decodebench serve and vllm serve."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def speculative_args(checkpoint) -> tuple[str, ...]:
    """A server drafting with the target's first 10 layers (a draft model: q reaches the verifier), as
    ``--model mtad --model_args backend=vllm,draft=self:10`` configures its engine, in float32 (the CPU build's
    default, bfloat16, is emulated on a CPU without bfloat16 instructions: several times slower per step)."""
    from decodebench.models.mtad.config import MTADConfig
    from decodebench.models.mtad.vllm_engine import speculative_config

    config = speculative_config(MTADConfig(draft="self:10"), str(checkpoint))
    args = ("--speculative-config", json.dumps(config), *FLOAT32)
    return (*args, "--per-request-spec-decode-metrics", "summary")  # each request's acceptance on its last chunk


@pytest.fixture(scope="module")
def servers(embedded_checkpoint, tmp_path_factory):
    """Both of the module's servers, started together: the speculative one comes up while the plain one's tests run
    (an engine start is ~35 s here, much of it one process importing)."""
    started = {
        "plain": Server(tmp_path_factory.mktemp("served"), *FLOAT32),
        "speculative": Server(tmp_path_factory.mktemp("speculative"), *speculative_args(embedded_checkpoint)),
    }
    yield started
    for running in started.values():
        running.stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers["plain"].ready()


def served_args(server, model: str, extra: str, out, *args: str) -> tuple[str, ...]:
    return (
        *("--model", model, "--model_args", f"backend=served,pretrained=embedded,base_url={server.base_url}{extra}"),
        *("--tasks", "squad_mini", "--limit", LIMIT, *SHORT, "--apply_chat_template"),
        *("--output_path", str(out), "--log_samples", *args),
    )


def served(server, model: str, extra: str, out, *args: str, cwd):
    """The real `lm_eval` command against the server, for tests that read how it exits and what it prints."""
    return run_lm_eval(*served_args(server, model, extra, out, *args), cwd=cwd)


def _post(url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def texts(out) -> dict[int, str]:
    return {s["doc_id"]: s["resps"][0][0] for s in read_samples(out, "squad_mini")}


def test_decodebench_serve_prints_what_to_run(server):
    import psutil

    assert "serving " in server.output() and f"base_url={server.base_url}" in server.output()
    # the layout of one GPU: one engine core process, its worker inside it (vLLM names its processes)
    names = [" ".join(p.cmdline()[:3]).strip() for p in psutil.Process(server.process.pid).children(recursive=True)]
    assert names.count("VLLM::EngineCore") == 1 and not any("Worker" in name for name in names), names
    with urllib.request.urlopen(server.base_url.removesuffix("/v1") + "/metrics", timeout=10) as metrics:
        assert b"vllm:" in metrics.read()


@pytest.fixture(scope="module")
def served_baseline(server, tmp_path_factory):
    """The baseline through the server, 4 requests in flight: the output folder."""
    folder = tmp_path_factory.mktemp("served-baseline")
    lm_eval_in_process(*served_args(server, "baseline", ",num_concurrent=4", folder / "served"), cwd=folder)
    return folder / "served"


def check_per_token_gaps(record: dict) -> None:
    """Each gap after the first chunk is shared by the tokens its chunk carries. A busy server may send several tokens
    in one chunk, the first chunk included, so at most every token after the first has a gap of its own."""
    gaps, chunk_gaps = record["inter_token_s"], record["chunk_gaps_s"]
    assert len(chunk_gaps) <= len(gaps) <= record["new_tokens"] - 1
    assert sum(gaps) == pytest.approx(sum(chunk_gaps), rel=1e-9, abs=1e-12)


def test_served_answers_equal_the_in_process_engines_and_every_request_is_measured(served_baseline, vllm_run, tmp_path):
    (tmp_path / "served").symlink_to(served_baseline)
    (tmp_path / "local").symlink_to(vllm_run("baseline"))
    answers = texts(tmp_path / "served")
    assert answers == texts(tmp_path / "local") and sum(bool(t.strip()) for t in answers.values()) >= 6
    scores = read_results(tmp_path / "served")["results"]["squad_mini"]
    assert scores == read_results(tmp_path / "local")["results"]["squad_mini"]
    info = read_results(tmp_path / "served")["config"]["decodebench"]
    assert info["backend"] == "served" and info["method"] == "baseline"
    stats = info["tasks"]["squad_mini"]
    assert stats["requests"] == int(LIMIT) and stats["ttft_s"] and stats["itl_s"] and stats["engine"]
    assert stats["engine"]["peak vllm:num_requests_running"] >= 1
    for sample in read_samples(tmp_path / "served", "squad_mini"):
        (record,) = sample["decodebench"]
        assert 0 < record["ttft_s"] < record["latency_s"]
        check_per_token_gaps(record)
    local_tokens = {
        s["doc_id"]: s["decodebench"][0]["new_tokens"] for s in read_samples(tmp_path / "local", "squad_mini")
    }
    served_tokens = {
        s["doc_id"]: s["decodebench"][0]["new_tokens"] for s in read_samples(tmp_path / "served", "squad_mini")
    }
    assert served_tokens == local_tokens


def test_lz_through_the_server_changes_the_output_as_lz_in_process_does(server, served_baseline, vllm_run, tmp_path):
    lm_eval_in_process(*served_args(server, "lz", STRONG_LZ, tmp_path / "served"), cwd=tmp_path)
    assert texts(tmp_path / "served") == texts(vllm_run("lz", STRONG_LZ))
    assert texts(tmp_path / "served") != texts(served_baseline), "a strong LZ penalty must change some answer"


def test_vllm_serve_switches_the_lz_penalty_on_per_request(server, embedded_checkpoint):
    """Installed, decodebench registers its processor with vLLM: the server needs no flag, and an OpenAI-compatible
    request asks for the penalty through vllm_xargs; requests that do not are untouched, mixed in one batch."""
    base = server.base_url.removesuffix("/v1")

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


def test_a_sweep_measures_method_and_baseline_at_each_load_and_the_report_draws_it(server, tmp_path):
    """`decodebench sweep` through the real lm_eval and server: every level's runs, a ratio per level (its interval
    over rounds: tests/test_stats.py), and a leaderboard that draws throughput against latency across loads."""
    proc = decodebench_in_process(
        *("sweep", "--model", "lz", "--model-args", "pretrained=embedded"),
        *("--base-url", server.base_url, "--concurrency", "1,4", "--tasks", "squad_mini", "--limit", "4"),
        *("--rounds", "1", "--gen-kwargs", "max_gen_toks=16", "--out", str(tmp_path / "sweep")),
        *("--slo", "ttft:600000;tpot:600000"),  # ten minutes: every request meets it
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    summary = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["levels"]
    assert set(summary) == {"1 in flight", "4 in flight"}
    for level in ("1 in flight", "4 in flight"):
        row = summary[level]["squad_mini"]
        assert row["rounds"] == 1 and row["n"] == 4 and row["throughput_ratio"] > 0
        assert row["throughput_ratio_interval"] is None  # one round: no interval over rounds
        assert all(v > 0 for v in row["throughput"].values())
        assert row["latency"]["method"]["ttft_s"]["p50"] > 0
        assert all(row["slo"][side]["met"] == row["slo"][side]["n"] == 4 for side in ("baseline", "method"))
    for number in (1,):
        for level in (1, 4):
            for side in ("baseline", "method"):
                assert results_files(tmp_path / "sweep" / f"round-{number}" / f"concurrency-{level}" / side)
    assert "| 4 in flight | squad_mini |" in (tmp_path / "sweep" / "sweep.md").read_text()
    # every prompt went through the server once before the timed runs, and that pass left no results behind
    assert "warm-up: every prompt once, untimed" in proc.stdout
    assert len(list((tmp_path / "sweep").glob("**/results_*.json"))) == 4
    report = decodebench_in_process("report", str(tmp_path / "sweep"), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert report.returncode == 0, explain(report)
    html = (tmp_path / "report" / "leaderboard.html").read_text()
    assert "throughput against latency across concurrency" in html


def test_bad_input_and_faults_say_what_happened(server, tmp_path):
    nobody = f"http://127.0.0.1:{_free_port()}/v1"
    closed = run_lm_eval(
        *("--model", "baseline", "--model_args", f"backend=served,pretrained=embedded,base_url={nobody}"),
        *("--tasks", "squad_mini", "--limit", "1", "--output_path", str(tmp_path / "closed")),
        cwd=tmp_path,
    )
    assert closed.returncode != 0 and f"cannot reach an OpenAI-compatible server at {nobody[:-3]}" in closed.stderr
    # a request the server refuses (a vllm_xargs its LZ processor cannot take): its own message, no retry
    import asyncio

    import aiohttp

    from decodebench.models.backends.served import ServedError
    from decodebench.models.baseline import Baseline

    client = Baseline.create({"backend": "served", "pretrained": "embedded", "base_url": server.base_url})
    payload = {"model": client.model, "prompt": "Count to ten:", "max_tokens": 4, "vllm_xargs": {"lz_penalty": -1}}

    async def send():
        async with aiohttp.ClientSession() as session:
            return await client._send(session, payload)

    with pytest.raises(ServedError, match=r"the server refused a request \(HTTP 400\): .*strength=-1"):
        asyncio.run(send())
    slow = served(server, "baseline", ",timeout=1", tmp_path / "slow", "--gen_kwargs", "max_gen_toks=200", cwd=tmp_path)
    assert slow.returncode != 0 and "a request took more than timeout=1 s" in slow.stderr
    assert results_files(tmp_path / "slow") == []


def test_decodebench_serve_refuses_a_taken_port_before_starting_anything(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        proc = run_command([console_script("decodebench"), "serve", "--port", str(port)], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and f"port {port} on 127.0.0.1 is taken" in proc.stderr, explain(proc)
    assert "starting" not in proc.stdout and time.monotonic() - started < 60


def test_decodebench_serve_reads_model_lengths_as_vllm_does(embedded_checkpoint, monkeypatch):
    from decodebench.commands import serve
    from decodebench.models.backends import vllm_kv_cache

    asked = []
    monkeypatch.setattr(vllm_kv_cache, "cpu_kv_cache_bytes", lambda model, length: asked.append(length) or 1)
    for value, length in (("4k", 4000), ("1K", 1024), ("auto", None), ("-1", None), ("1024", 1024)):
        command = serve.vllm_command(str(embedded_checkpoint), "127.0.0.1", 8000, ["--max-model-len", value])
        assert command[-2:] == ["--kv-cache-memory-bytes", "1"] and asked[-1] == length, value


def test_decodebench_serve_sizes_the_kv_cache_as_vllm_and_transformers_would_without_importing_them(
    embedded_checkpoint, tmp_path
):
    """decodebench serve only starts vllm serve: it reads the platform by vLLM's rule and a local config.json as
    transformers reads it, and imports neither (any vLLM module imports torch: seconds of CPU at every start)."""
    from transformers import AutoConfig, GPT2Config
    from vllm.platforms import current_platform

    from decodebench.commands import serve
    from decodebench.models.backends import vllm_kv_cache

    assert serve._on_cpu() == current_platform.is_cpu()
    config = AutoConfig.from_pretrained(embedded_checkpoint)
    read = vllm_kv_cache._text_config(str(embedded_checkpoint))
    assert {field: read[field] for field in vllm_kv_cache.SIZING_FIELDS} == {
        field: getattr(config, field) for field in vllm_kv_cache.SIZING_FIELDS
    }
    # a config whose fields transformers renames (GPT-2: n_head, n_layer, n_positions) is read through transformers
    GPT2Config(n_head=4, n_layer=2, n_embd=64, n_positions=256).save_pretrained(tmp_path / "gpt2")
    gpt2 = vllm_kv_cache._text_config(str(tmp_path / "gpt2"))
    assert (gpt2["num_attention_heads"], gpt2["num_hidden_layers"], gpt2["max_position_embeddings"]) == (4, 2, 256)
    probe = (
        "import sys; from decodebench.commands import serve; "
        "print(serve.vllm_command(sys.argv[1], '127.0.0.1', 8000, ['--max-model-len', '1024'])[-2:]); "
        "print(sorted({name.split('.')[0] for name in sys.modules} & {'torch', 'transformers', 'vllm'}))"
    )
    proc = run_command([sys.executable, "-c", probe, str(embedded_checkpoint)], cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    sized, imported = proc.stdout.strip().splitlines()[-2:]
    assert sized.startswith("['--kv-cache-memory-bytes', '") == current_platform.is_cpu(), sized
    assert imported == "[]"


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_decodebench_serve_stopped_while_starting_leaves_no_engine_behind(embedded_checkpoint):
    """Stopped by SIGTERM (as a service manager or the 900 s start limit would), and by Ctrl-C where SIGINT came in
    ignored (a script's `decodebench serve &`: it used to stay deaf, outlive its parent's stop and leave vLLM
    running). Both start at once: a start is one process importing at a time, so two share the machine's cores.
    Ctrl-C stops its server once vllm serve runs (both signals take the same way out, KeyboardInterrupt); SIGTERM
    once vllm serve has started its engine process (its import costs ~20 s of CPU, not needed twice)."""
    import psutil

    starting = {}
    for stop, inherited, processes in ((signal.SIGINT, _ignore_sigint, 1), (signal.SIGTERM, None, 2)):
        command = [console_script("decodebench"), "serve", "--port", str(_free_port()), *SERVER_ARGS]
        output = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        proc = subprocess.Popen(command, env=offline_env(), preexec_fn=inherited, **output)
        starting[stop] = proc, Lines(proc.stdout), processes
    try:
        for stop, (proc, output, processes) in starting.items():
            assert output.wait_for("starting ("), output.text()
            serving, deadline = psutil.Process(proc.pid), time.monotonic() + 300
            started = []
            while len(started) < processes and time.monotonic() < deadline:  # vllm serve, then its engine process
                started = serving.children(recursive=True)
                time.sleep(0.2)  # polls for the processes to appear; the test waits on them, not on the time
            assert len(started) >= processes, output.text()
            started = serving.children(recursive=True)
            proc.send_signal(stop)
            proc.wait(timeout=180)
            alive = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            assert alive == [], f"{stop.name}: left running: {[p.cmdline()[:3] for p in alive]}"
    finally:
        for proc, _, _ in starting.values():
            if proc.poll() is None:
                proc.kill()


@pytest.fixture(scope="module")
def speculative_server(servers):
    return servers["speculative"].ready()


def test_a_server_that_speculates_starts_on_the_runner_its_rules_need(speculative_server, server):
    assert "VLLM_USE_V2_MODEL_RUNNER: V1 model runner" in speculative_server.output()
    assert "VLLM_USE_V2_MODEL_RUNNER: vLLM's choice" in server.output()


def test_with_speculation_chunks_carry_several_tokens_and_the_counters_show_it(speculative_server, tmp_path):
    lm_eval_in_process(
        *(
            "--model",
            "baseline",
            "--model_args",
            f"backend=served,pretrained=embedded,base_url={speculative_server.base_url}",
        ),
        *("--tasks", "squad_mini", "--limit", "2", "--gen_kwargs", "max_gen_toks=32", "--apply_chat_template"),
        *("--output_path", str(tmp_path / "out"), "--log_samples"),
        cwd=tmp_path,
    )
    stats = read_results(tmp_path / "out")["config"]["decodebench"]["tasks"]["squad_mini"]
    counters = stats["engine"]
    assert counters["vllm:spec_decode_num_drafts_total"] > 0 and counters["mean_acceptance_length"] >= 1
    records = [s["decodebench"][0] for s in read_samples(tmp_path / "out", "squad_mini")]
    for record in records:
        check_per_token_gaps(record)
    gaps = [gap for record in records for gap in record["inter_token_s"]]
    # a chunk of k tokens gives k equal intervals: the draft (the target's own first layers) lands some
    assert any(gaps[i] == gaps[i + 1] for i in range(len(gaps) - 1)), "no chunk carried more than one token"
    # vLLM's raw chunk gaps: fewer than the tokens where chunks carried several
    assert sum(len(record["chunk_gaps_s"]) for record in records) < len(gaps)
    # each request's own acceptance, as the server reported it, and their distribution in the results
    assert all(record["spec_decode"]["mean_acceptance_length"] >= 1 for record in records)
    assert stats["spec_decode_per_request"]["requests"] == len(records)


def test_mtad_through_the_server_verifies_by_its_rule_and_vllms_rule_stays_for_the_rest(speculative_server, tmp_path):
    """The same sampled requests (the untouched target, q from the draft model): with MTAD's tau = 0 every draft
    token is accepted, which only MTAD's rule does (p / q > 0 everywhere); the baseline's requests keep vLLM's rule,
    which rejects some. The statistics come from the server's counters."""
    rates = {}
    for model, extra in (("mtad", ",mode=mtad,tau=0"), ("baseline", "")):
        args = f"backend=served,pretrained=embedded,base_url={speculative_server.base_url},num_concurrent=2{extra}"
        lm_eval_in_process(
            *("--model", model, "--model_args", args, "--tasks", "squad_mini", "--limit", "2"),
            *("--gen_kwargs", "do_sample=true,temperature=1.0,top_k=-1,top_p=1.0,max_gen_toks=24"),
            *("--apply_chat_template", "--output_path", str(tmp_path / model)),
            cwd=tmp_path,
        )
        stats = read_results(tmp_path / model)["config"]["decodebench"]["tasks"]["squad_mini"]
        counters = stats["engine"]
        assert counters["vllm:spec_decode_num_drafts_total"] > 0
        rates[model] = (
            counters["vllm:spec_decode_num_accepted_tokens_total"] / counters["vllm:spec_decode_num_draft_tokens_total"]
        )
        if model == "mtad":
            assert stats["method"]["acceptance_rate"] == rates["mtad"]
            assert stats["method"]["acceptance_per_position"][0] == 1.0  # per position: the labelled series
            assert sum(stats["method"]["acceptance_histogram"].values()) == stats["method"]["iterations"]
    assert rates["mtad"] == 1.0 and rates["baseline"] < 1.0, rates


def test_sampled_mtad_and_block_requests_with_structured_outputs_complete_and_the_server_keeps_serving(
    speculative_server, embedded_checkpoint
):
    """Sampled MTAD (top-k and top-p: the draft is warped, in float32, from a bfloat16 draft model) and block
    verification, each on requests whose output a grammar constrains (vLLM marks draft tokens the grammar refuses
    with -1, which the rules must never keep or index with), beside a plain request: every answer obeys the grammar,
    and the server answers again afterwards."""
    base = speculative_server.base_url.removesuffix("/v1")
    choices = ["positive", "negative", "neutral"]

    def complete(**extra):
        payload = {
            "model": str(embedded_checkpoint),
            "prompt": "Review: the film was a delight from start to end. Sentiment:",
            "max_tokens": 24,
            "temperature": 1.0,
            "top_k": 20,
            "top_p": 0.9,
            "seed": 7,
            **extra,
        }
        return _post(f"{base}/v1/completions", payload)

    grammar = {"structured_outputs": {"choice": choices}}
    requests = [{"vllm_xargs": {"mtad_tau": 0.1}, **grammar}, {"vllm_xargs": {"block_verify": True}, **grammar}]
    requests += [{"vllm_xargs": {"mtad_tau": 0.1}}, {"vllm_xargs": {"block_verify": True}}, {}]
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda extra: complete(**extra), requests))
    assert [status for status, _ in answers] == [200] * len(requests), answers
    assert [answer["choices"][0]["text"] in choices for _, answer in answers[:2]] == [True, True], answers[:2]
    assert all(answer["choices"][0]["text"] for _, answer in answers[2:])
    status, again = complete()
    assert status == 200 and again["choices"][0]["text"]


def test_lz_through_a_server_that_speculates_says_when_it_applies(speculative_server, tmp_path):
    """A server that speculates applies the LZ penalty only on vLLM's V2 runner (this one runs V1), which the client
    cannot see: the results say so."""
    args = f"backend=served,pretrained=embedded,base_url={speculative_server.base_url}"
    proc = run_lm_eval(
        *("--model", "lz", "--model_args", args, "--tasks", "squad_mini", "--limit", "1"),
        *("--gen_kwargs", "max_gen_toks=24", "--apply_chat_template", "--output_path", str(tmp_path / "out")),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    method = read_results(tmp_path / "out")["config"]["decodebench"]["tasks"]["squad_mini"]["method"]
    assert "only vLLM's V2 model runner applies one" in method["applied_if"]
    assert "LZ through a server that speculates" in proc.stderr


def test_a_server_killed_mid_run_fails_the_run_clearly_and_writes_no_results(speculative_server, tmp_path):
    from decodebench.commands.runs import lm_eval_process, wait

    model_args = f"backend=served,pretrained=embedded,base_url={speculative_server.base_url},max_retries=1"
    argv = ["--model", "baseline", "--model_args", model_args, "--tasks", "cnndm_mini", "--limit", "20"]
    argv += ["--gen_kwargs", "max_gen_toks=256", "--apply_chat_template", "--output_path", str(tmp_path / "out")]
    read_end, write_end = os.pipe()
    with open(os.devnull, "w") as devnull:  # forked as decodebench's commands run lm_eval; its stderr read as it comes
        run = lm_eval_process(argv, cwd=tmp_path, stdout=devnull.fileno(), stderr=write_end)
    os.close(write_end)  # the run holds its own copy: the stream ends when the run does
    stderr_lines = Lines(os.fdopen(read_end, errors="replace"))
    assert stderr_lines.wait_for("Running generate_until requests"), stderr_lines.text()[-3000:]  # under way
    speculative_server.kill()
    code = wait(run, timeout=300)
    stderr = stderr_lines.text()
    assert code not in (0, None)
    assert "stopped answering" in stderr or "cannot reach" in stderr, stderr[-3000:]
    assert results_files(tmp_path / "out") == []
