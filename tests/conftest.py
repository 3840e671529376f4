"""Shared helpers: the real `lm_eval` command in a subprocess, offline, and its output files."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session", autouse=True)
def environment_described_once():
    """lm-eval writes torch's description of the environment into every results file (``get_pretty_env_info``:
    ``pip list`` and other subprocesses, ~0.5 s a run). Within this test process it cannot change, so the lm_eval
    runs made in this process describe it once; each forked or started run still describes its own."""
    import functools

    from torch.utils import collect_env

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(collect_env, "get_pretty_env_info", functools.cache(collect_env.get_pretty_env_info))
        yield


def offline_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **extra,
    }


def console_script(name: str) -> str:
    """The installed console script of this environment (what a user types)."""
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            raise FileNotFoundError(f"console script {name} is not installed")
        return found
    return str(path)


def run_command(args: list[str], cwd: Path, timeout: int = 1200, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=offline_env(**env), capture_output=True, text=True, timeout=timeout)


def run_lm_eval(*args: str, cwd: Path, timeout: int = 1200, **env: str) -> subprocess.CompletedProcess:
    """``lm_eval ARGS`` in a process of its own, as decodebench's commands run it (``decodebench.commands.runs``:
    forked from a process that imported lm-eval, torch and transformers once, ~8 s a run less than starting the
    console script); its exit code and what it wrote to stdout and stderr. Tests of the console script itself (the
    start-up hook) run it with ``run_command``."""
    import tempfile

    from decodebench.commands.runs import lm_eval_process, wait

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = lm_eval_process(list(args), cwd=cwd, env=offline_env(**env), stdout=out.fileno(), stderr=err.fileno())
        code = wait(process, timeout)
        if code is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["lm_eval", *args], timeout)
        out.seek(0)
        err.seek(0)
        text = [stream.read().decode(errors="replace") for stream in (out, err)]
    return subprocess.CompletedProcess(["lm_eval", *args], code, *text)


def lm_eval_in_process(*args: str, cwd: Path, **env: str) -> None:
    """``lm_eval ARGS`` run in this process: lm-eval's own command-line entry point with this argv, decodebench's
    start-up hook already active, offline, from ``cwd``. What the command writes, without starting a Python that
    imports torch, transformers and lm-eval again (~8 s a run here); for tests that read what a run wrote, not how
    the command exits or what it prints (those run ``run_lm_eval``). ``env``: variables set for the run. A failed run
    raises."""
    from lm_eval.__main__ import cli_evaluate

    argv, here, environ = sys.argv, Path.cwd(), dict(os.environ)
    sys.argv = ["lm_eval", *args]
    os.environ.update(offline_env(**env))
    os.chdir(cwd)
    try:
        cli_evaluate()
    finally:
        sys.argv = argv
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)


def main_in_process(main, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``main(argv)`` (a command's entry point) in this process, from ``cwd``: its exit code and what it printed,
    without a new Python that imports decodebench and starts a fork server of its own for its ``lm_eval`` runs
    (~15 s of CPU here); its runs fork from this session's fork server, as ``run_lm_eval``'s do. Tests of how a
    console script starts or stops (Ctrl-C, an installed method) run it with ``run_command``."""
    import contextlib
    import io

    stdout, stderr, here = io.StringIO(), io.StringIO(), Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(list(argv))
            except SystemExit as stop:  # argparse's errors, and commands that exit with a message
                code = stop.code if isinstance(stop.code, int) or stop.code is None else 1
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess([main.__module__, *argv], code or 0, stdout.getvalue(), stderr.getvalue())


def decodebench_in_process(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``decodebench ARGV`` through ``main_in_process``."""
    from decodebench.commands.cli import main

    return main_in_process(main, *argv, cwd=cwd)


def results_files(output_path: Path) -> list[Path]:
    return sorted(output_path.glob("**/results_*.json"))


def read_results(output_path: Path) -> dict:
    files = results_files(output_path)
    assert len(files) == 1, f"expected one results file under {output_path}, found {files}"
    return json.loads(files[0].read_text())


def read_samples(output_path: Path, task: str) -> list[dict]:
    files = sorted(output_path.glob(f"**/samples_{task}_*.jsonl"))
    assert len(files) == 1, f"expected one samples file for {task}, found {files}"
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


class Lines:
    """A process's output stream read line by line on a thread (so its pipe never fills), to wait on what it says
    instead of sleeping: ``wait_for(text, times)`` returns once ``text`` has appeared in ``times`` lines."""

    def __init__(self, stream):
        import threading

        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    closed = False

    def wait_for(self, text: str, times: int = 1, timeout: float = 600) -> bool:
        with self._changed:
            return (
                self._changed.wait_for(
                    lambda: self.closed or sum(text in line for line in self.lines) >= times, timeout=timeout
                )
                and sum(text in line for line in self.lines) >= times
            )

    def text(self, timeout: float = 60) -> str:
        """Everything read, once the stream has ended (or after ``timeout``)."""
        self._thread.join(timeout)
        return "".join(self.lines)


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="session")
def embedded_checkpoint() -> Path:
    """The embedded model, materialized once per cache folder (DECODEBENCH_HOME)."""
    from decodebench.data.embedded import ensure_embedded_model

    return ensure_embedded_model()


# -- commands started beside the tests --------------------------------------------------------------------------
# Each test environment runs one test at a time, so its time is the sum of its tests'. A command a test needs that
# depends on nothing the tests do (pip building the GPU wheelhouse, ~20 s of one core; vLLM's own tests, ~30 s) starts
# once the tests are collected, in a thread beside the tests before it, and the test waits for its end.


def _wheelhouse_command(folder: Path) -> tuple[list[str], Path, dict[str, str]]:
    """The README's GPU recipe, decodebench's wheel built from this checkout as a user runs it."""
    return [sys.executable, str(REPO / "studies" / "gpu_wheelhouse.py"), "--out", str(folder / "house")], folder, {}


def _vllm_own_tests_command(folder: Path) -> tuple[list[str], Path, dict[str, str]]:
    from vllm_suite import own_tests_command  # fetches vLLM's test suite once

    return own_tests_command()


def _vllm_next_own_tests_command(folder: Path) -> tuple[list[str], Path, dict[str, str]]:
    from vllm_suite import NEXT, own_tests_command  # fetches the next release's tests and Python files once

    return own_tests_command(NEXT)


def _vllm_next_rule_tests_command(folder: Path) -> tuple[list[str], Path, dict[str, str]]:
    from vllm_suite import NEXT, rule_tests_command

    return rule_tests_command(NEXT)


def _vllm_bundle_command(folder: Path) -> tuple[list[str], Path, dict[str, str]]:
    """The slim vLLM bundle for a GPU machine (gz: the same bundle, five times faster to pack than the default xz)."""
    script = REPO / "studies" / "gpu_vllm_bundle.py"
    return [sys.executable, str(script), "--out", str(folder / "bundle"), "--compression", "gz"], folder, {}


def _gpu_vllm_dry_run_command(folder: Path) -> tuple[list[str], Path, dict[str, str]]:
    """The vLLM GPU script's dry run on vLLM's CPU build, on the embedded model's config and tokenizer."""
    from decodebench.data.embedded import ensure_embedded_model

    script = REPO / "studies" / "gpu_vllm.py"
    model = str(ensure_embedded_model())
    return [sys.executable, str(script), "--dry-run", "--model", model, "--out", str(folder / "out")], folder, {}


# fixture name -> (the command, its working folder and environment, given a folder of its own; the fixtures whose
# use by a collected test starts it)
BACKGROUND_JOBS = {
    "wheelhouse": (_wheelhouse_command, {"wheelhouse", "decodebench_wheel"}),
    "vllm_own_tests": (_vllm_own_tests_command, {"vllm_own_tests"}),
    "vllm_next_own_tests": (_vllm_next_own_tests_command, {"vllm_next_tests"}),
    "vllm_next_rule_tests": (_vllm_next_rule_tests_command, {"vllm_next_tests"}),
    "vllm_bundle": (_vllm_bundle_command, {"vllm_bundle"}),
    "gpu_vllm_dry_run": (_gpu_vllm_dry_run_command, {"gpu_vllm_dry_run"}),
}
_STARTED: dict[str, tuple[concurrent.futures.Future, Path]] = {}  # name -> (its future, its log)
_PROCESSES: list[subprocess.Popen] = []
_SESSION_OVER = threading.Event()  # set when the session ends: a job still preparing starts nothing
_STARTING = threading.Lock()  # a job starts its process, or the session's end stops them all, not both at once


def _run_job(make_command, log: Path) -> int:
    command, cwd, env = make_command(log.parent)
    with open(log, "w") as output:
        with _STARTING:
            if _SESSION_OVER.is_set():
                return -1
            env = offline_env(**env)
            process = subprocess.Popen(command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
            _PROCESSES.append(process)
        return process.wait()


# vLLM's modules the vllm tests import in this process (lm-eval's vllm model and the in-process engines)
VLLM_IMPORTS = ("vllm.entrypoints.llm",)


def freeze_what_the_session_imports(session) -> None:
    """Import what this session's tests import in this process anyway (what every lm_eval run imports, and vLLM where
    its tests run), then move every object alive to the garbage collector's permanent generation (``gc.freeze``):
    the million objects of torch's, transformers', lm-eval's and vLLM's modules, which each full collection walked
    and which live as long as the session anyway."""
    import gc
    import importlib
    import importlib.util

    from decodebench.commands.runs import RUN_IMPORTS, STARTUP_IMPORTS

    modules = [*STARTUP_IMPORTS, *RUN_IMPORTS]
    if importlib.util.find_spec("vllm") and any(item.get_closest_marker("vllm") for item in session.items):
        modules += VLLM_IMPORTS
    for module in modules:
        importlib.import_module(module)
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """A vLLM engine freezes the heap once it has started and unfreezes all of it as it shuts down (its
    ``freeze_gc_heap``, ``EngineCore.shutdown``), what this session froze too: after a test that ended one, what is
    alive is frozen again (collected first, so no garbage is kept)."""
    import gc

    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    freeze_what_the_session_imports(session)
    used = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    jobs = {name: make for name, (make, users) in BACKGROUND_JOBS.items() if used & users}
    if jobs:
        pool = concurrent.futures.ThreadPoolExecutor(len(jobs), thread_name_prefix="background")
        for name, make in jobs.items():
            log = Path(session.config._tmp_path_factory.mktemp(name)) / f"{name}.log"  # pytest's own, as tmp_path's
            _STARTED[name] = pool.submit(_run_job, make, log), log
        pool.shutdown(wait=False)


def wait_for_background(name: str, timeout: float = 900) -> tuple[Path, str]:
    """The job's end (a failure to start or a non-zero exit fails the test, with its output): its folder and
    output."""
    future, log = _STARTED[name]
    code = future.result(timeout=timeout)
    output = log.read_text()
    assert code == 0, f"{name} exited with {code}:\n" + output[-3000:]
    return log.parent, output


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """The README's GPU recipe, `python studies/gpu_wheelhouse.py --out DIR`, run beside the tests: DIR."""
    return wait_for_background("wheelhouse")[0] / "house"


@pytest.fixture(scope="session")
def decodebench_wheel(wheelhouse) -> Path:
    """decodebench's wheel, built from this checkout by the wheelhouse's recipe."""
    (wheel,) = wheelhouse.glob("part-*/decodebench-*.whl")
    return wheel


@pytest.fixture(scope="session")
def vllm_bundle() -> Path:
    """`python studies/gpu_vllm_bundle.py --out DIR` (gz), run beside the tests: DIR."""
    return wait_for_background("vllm_bundle")[0] / "bundle"


@pytest.fixture(scope="session")
def gpu_vllm_dry_run() -> Path:
    """`python studies/gpu_vllm.py --dry-run --out DIR` on vLLM's CPU build, run beside the tests: DIR."""
    return wait_for_background("gpu_vllm_dry_run")[0] / "out"


@pytest.fixture(scope="session")
def vllm_own_tests() -> str:
    """The output of vLLM's own tests (tests/vllm_suite.py), run beside the tests."""
    return wait_for_background("vllm_own_tests")[1]


@pytest.fixture(scope="session")
def vllm_next_tests() -> tuple[str, str]:
    """The outputs of the next vLLM release's own tests and of decodebench's rule tests over its Python files
    (tests/vllm_suite.py), run beside the tests."""
    return wait_for_background("vllm_next_own_tests")[1], wait_for_background("vllm_next_rule_tests")[1]


def pytest_report_header(config):
    """Which vLLM the session runs (an overlay's release, tests/vllm_suite.py, is not what pip lists)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    import vllm

    return f"vllm {vllm.__version__} ({Path(vllm.__file__).parent})"


def pytest_sessionfinish(session):
    with _STARTING:
        _SESSION_OVER.set()
    for process in _PROCESSES:
        if process.poll() is None:  # a session stopped early (-x, Ctrl-C)
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def tiny_checkpoint(embedded_checkpoint, tmp_path_factory) -> Path:
    """A tiny random-config Llama (2 layers, hidden 64) with the embedded model's tokenizer and chat
    template: the model logic of every method runs on it in a fraction of a second."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(embedded_checkpoint)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def fake_requests(prompts: list[str], **gen_kwargs) -> list:
    """lm-eval ``Instance``-like requests of one task, for calling ``generate_until`` directly."""
    from types import SimpleNamespace

    kwargs = {"until": [], "max_gen_toks": 16, "do_sample": False, **gen_kwargs}
    return [SimpleNamespace(task_name="t", doc_id=i, idx=0, args=(p, dict(kwargs))) for i, p in enumerate(prompts)]


# -- vLLM's in-process engine, shared ------------------------------------------------------------------------------
# An engine start costs ~20 s here: each configuration runs once per test session, and every test that compares with
# it reads the same output. float32: in bfloat16 a batch of another size flips a near-tie of greedy decoding now and
# then, and the served tests compare these answers with a server's.
VLLM_ENGINE = "max_model_len=1024,enforce_eager=True,seed=0,dtype=float32"
VLLM_TASKS = ("squad_mini",)  # short prompts: the engines' answers, not their prefill, are what is compared
VLLM_LIMIT = 8
VLLM_MAX_GEN_TOKS = 24
# an LZ penalty strong enough to change answers, and the codelength of the paper's propositions
STRONG_LZ = ",strength=3.0,codelength=propositions"


def lm_eval_with_vllm_engine(*args: str, cwd: Path) -> None:
    """``lm_eval ARGS`` with the vLLM engine core in lm-eval's process, this one: a subprocess would import torch,
    lm-eval and vLLM again (~20 s a run here). (Engines after one that drafted from the context start here too: vLLM
    0.32.0's CPU build could not start one once numba was imported, which decodebench's CPU fix mends.)"""
    lm_eval_in_process(*args, cwd=cwd, VLLM_ENABLE_V1_MULTIPROCESSING="0")


@pytest.fixture(scope="session")
def vllm_run(embedded_checkpoint, tmp_path_factory):
    """``vllm_run(model, extra)``: the output folder of ``lm_eval --model MODEL --model_args
    backend=vllm,pretrained=embedded,<VLLM_ENGINE><extra>`` on VLLM_TASKS (VLLM_LIMIT documents each, greedy,
    VLLM_MAX_GEN_TOKS new tokens at most, batch 8, the chat template, samples logged), the engine core in lm-eval's
    process (lm_eval_with_vllm_engine); each configuration runs once per session, the first time a test asks for
    it."""
    runs: dict[tuple[str, str], Path] = {}

    def run(model: str, extra: str = "") -> Path:
        if (model, extra) not in runs:
            folder = tmp_path_factory.mktemp(f"vllm-{model}")
            lm_eval_with_vllm_engine(
                *("--model", model, "--model_args", f"backend=vllm,pretrained=embedded,{VLLM_ENGINE}{extra}"),
                *("--tasks", ",".join(VLLM_TASKS), "--limit", str(VLLM_LIMIT), "--batch_size", "8"),
                *("--gen_kwargs", f"max_gen_toks={VLLM_MAX_GEN_TOKS}", "--apply_chat_template"),
                *("--output_path", str(folder / "out"), "--log_samples"),
                cwd=folder,
            )
            runs[model, extra] = folder / "out"
        return runs[model, extra]

    return run
