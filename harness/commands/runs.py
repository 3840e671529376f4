"""Running the real ``lm_eval`` command, offline, and finding what it wrote.

The main job (``decodebench demo``), the studies under studies/ and the interleaved comparisons run lm-eval as a
user does: ``lm_eval --model ... --output_path ...``, lm-eval's own command-line entry point, each run in a process
of its own (its own memory, environment, working directory, output and exit code), with the hub switched off.

Starting Python and importing torch, transformers and lm-eval again costs ~8 s a run on two cores, more than many
runs take, so each run's process is forked from one that has imported them once (``multiprocessing``'s fork server,
``lm_eval_process``) instead of starting ``python -m lm_eval``. The fork server never runs a tensor operation:
torch's OpenMP thread pool does not survive a fork, and the child of a process that has used it hangs at its first
parallel operation; nor does it initialize CUDA, which a forked process cannot use again (should an import ever do
so, each run starts a fresh Python instead).
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# The fork server's preparation, in order. What every lm_eval run imports before it reads a task; not vLLM: importing
# it costs runs that do not use it, and the fork server must stay free of threads and tensor operations.
STARTUP_IMPORTS = [
    "torch",
    "transformers",
    "datasets",
    "lm_eval.__main__",
    "lm_eval.evaluator",
    "lm_eval.models",
    "lm_eval.models.huggingface",
    "decodebench.models.backends.hf",
]
# lm-eval's task index, built once
TASK_INDEX = "decodebench.lmeval.task_index_warm"
# What a run imports once it loads its model, scores and writes its table: the same in every run, so imported once too
RUN_IMPORTS = [
    "transformers.modeling_utils",
    "transformers.models.llama.modeling_llama",  # the embedded model's architecture
    "pytablewriter",  # lm-eval's results table
    "infini_gram.engine",
    "decodebench.metrics.generation",
    "decodebench.data.taskdata",
    "decodebench.models.lz.method",
    "decodebench.models.mtad.method",
    "decodebench.models.nugget.method",
]
# Last: what the server holds, frozen out of the garbage collector's sight (``gc.freeze``), so that a run's
# collections do not walk, and copy, every object it was forked with (`python studies/fork_server_bench.py`: each run
# 1.2x faster on the embedded model with the run's imports made and the objects frozen).
FREEZE = "decodebench.commands.fork_server_frozen"
PRELOAD = [*STARTUP_IMPORTS, TASK_INDEX, *RUN_IMPORTS, FREEZE]


def offline_env() -> dict[str, str]:
    """Nothing may reach the Hugging Face hub: models and data are local."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def start_fork_server() -> None:
    """Start the fork server now, so that its imports overlap with other work (the first run waits for them)."""
    from multiprocessing import forkserver

    # hub settings are read when huggingface_hub is imported: the fork server imports it offline
    os.environ.update({key: value for key, value in offline_env().items() if key.startswith(("HF_", "TOKENIZERS"))})
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    with _main_module_left_out():
        forkserver.ensure_running()


def lm_eval_process(
    argv: list[str],
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
) -> multiprocessing.process.BaseProcess:
    """``lm_eval ARGV`` started in a process of its own, forked from the fork server: from ``cwd`` (default: this
    one's), with ``env`` as its whole environment (default: ``offline_env()``), writing to the file descriptors
    ``stdout`` and ``stderr`` (default: this process's). ``join()`` it; its ``exitcode`` is lm_eval's.

    What Python reads as it starts (``PYTHONPATH`` and the other ``PYTHON*`` variables, and with them the installed
    distributions and their entry points) is the fork server's: an ``env`` that changes it is refused (run the
    ``lm_eval`` console script for that)."""
    env = env if env is not None else offline_env()
    changed = sorted(
        key for key in {*env, *os.environ} if key.startswith("PYTHON") and env.get(key) != os.environ.get(key)
    )
    if changed:
        raise ValueError(f"a forked lm_eval run keeps this interpreter's start-up settings; env changes {changed}")
    start_fork_server()
    same_devices = env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
    context = multiprocessing.get_context("forkserver")
    process = context.Process(
        target=_lm_eval_main,
        args=(
            list(argv),
            str(cwd or Path.cwd()),
            env,
            _Descriptor(_fileno(sys.stdout, 1) if stdout is None else stdout),
            _Descriptor(_fileno(sys.stderr, 2) if stderr is None else stderr),
            described_environment() if same_devices else None,
        ),
        name="lm_eval",
    )
    with _main_module_left_out():
        process.start()
    return process


_MAIN_SWAP = threading.Lock()


@contextlib.contextmanager
def _main_module_left_out():
    """multiprocessing runs the parent's main script again in each child it starts this way (so that functions
    defined there can be unpickled): a run needs nothing of it, it costs the script's imports a run, and a script
    without an ``if __name__ == "__main__":`` guard would start over in the child. While a run starts, ``__main__``
    is an empty module."""
    with _MAIN_SWAP:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


@contextlib.contextmanager
def _killed_on_error(process: multiprocessing.process.BaseProcess):
    """Ctrl-C (lm_eval got it too) or any other exception inside kills ``process``: nothing of it outlives the run."""
    try:
        yield
    except BaseException:
        process.kill()
        process.join()
        raise


def wait(process: multiprocessing.process.BaseProcess, timeout: float | None = None) -> int | None:
    """``process``'s exit code once it has ended, or None when ``timeout`` seconds passed first (``_killed_on_error``
    while waiting)."""
    with _killed_on_error(process):
        process.join(timeout)
    return process.exitcode


class _Descriptor:
    """A file descriptor handed to the forked run (multiprocessing passes it over the fork server's socket)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return _received, (DupFd(self.fd),)


def _received(dup) -> int:
    return dup.detach()


def _fileno(stream, default: int) -> int:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by something without one (a capture buffer)
        return default


def forked_call(function: Callable[..., T], *args) -> T:
    """``function(*args)`` in a process forked from the fork server, which has torch and lm-eval imported (this
    process need not import them): its value, or its exception raised here. ``function``, ``args`` and the value are
    pickled."""
    start_fork_server()
    context = multiprocessing.get_context("forkserver")
    receiving, sending = context.Pipe(duplex=False)
    process = context.Process(target=_call_and_send, args=(sending, function, args), name=function.__name__)
    with _main_module_left_out():
        process.start()
    sending.close()
    with _killed_on_error(process):
        try:
            succeeded, value = receiving.recv()
        except EOFError:
            process.join()
            raise RuntimeError(f"{function.__name__} ended without a result (exit code {process.exitcode})") from None
        process.join()
    if not succeeded:
        raise value
    return value


def _call_and_send(sending, function, args) -> None:
    try:
        outcome = (True, function(*args))
    except Exception as exc:
        outcome = (False, exc)
    sending.send(outcome)
    sending.close()


@functools.cache
def described_environment() -> str:
    """torch's description of the machine and its packages, which lm-eval writes into every results file
    (``get_pretty_env_info``: ``pip list`` and other subprocesses, ~0.6 s a run on 2 cores), made once for all the
    runs this process starts: they share its machine, packages and devices. In a forked process, not in the fork
    server: on a GPU machine the description initializes CUDA, which a process forked from it could not use."""
    return forked_call(_pretty_env_info)


def _pretty_env_info() -> str:
    from torch.utils.collect_env import get_pretty_env_info

    return get_pretty_env_info()


def _lm_eval_main(
    argv: list[str], cwd: str, env: dict[str, str], stdout: int, stderr: int, environment: str | None = None
) -> None:
    """The forked run: the console script's ``lm_eval`` with this argv, environment and working directory (and
    ``environment``, the starting process's ``described_environment``, where the run sees the same devices)."""
    import atexit

    for fd, standard in ((stdout, 1), (stderr, 2)):
        os.dup2(fd, standard)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["lm_eval", *argv]
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda._is_in_bad_fork():  # CUDA was initialized before the fork: a fresh Python
        os.execve(sys.executable, [sys.executable, "-m", "lm_eval", *argv], env)
    if environment is not None:
        from torch.utils import collect_env

        collect_env.get_pretty_env_info = lambda: environment
    from lm_eval.__main__ import cli_evaluate

    try:
        cli_evaluate()
    finally:
        # what the interpreter runs at exit (multiprocessing ends a child with os._exit): lm-eval's and vLLM's
        # clean-ups, engine processes included
        atexit._run_exitfuncs()


@dataclass(frozen=True)
class LmEvalRun:
    """One ``lm_eval`` invocation; ``model_args`` are written ``key=value`` in order."""

    model: str
    tasks: list[str]
    output_path: Path
    model_args: dict[str, object] = field(default_factory=dict)
    batch_size: int | str = 1
    limit: int | None = None
    gen_kwargs: str | None = None
    chat_template: bool = True
    log_samples: bool = True
    extra: tuple[str, ...] = ()

    def arguments(self) -> list[str]:
        """``lm_eval``'s arguments."""
        args = ",".join(f"{key}={value}" for key, value in self.model_args.items())
        arguments = ["--model", self.model]
        if args:
            arguments += ["--model_args", args]
        arguments += ["--tasks", ",".join(self.tasks), "--batch_size", str(self.batch_size)]
        arguments += ["--output_path", str(self.output_path)]
        if self.limit is not None:
            arguments += ["--limit", str(self.limit)]
        if self.gen_kwargs:
            arguments += ["--gen_kwargs", self.gen_kwargs]
        if self.chat_template:
            arguments.append("--apply_chat_template")
        if self.log_samples:
            arguments.append("--log_samples")
        return [*arguments, *self.extra]

    def command(self) -> list[str]:
        """The same run as a command line of this interpreter (``python -m lm_eval ...``)."""
        return [sys.executable, "-m", "lm_eval", *self.arguments()]

    def shown(self) -> str:
        """The command as a user would type it."""
        return "lm_eval " + " ".join(_quote(part) for part in self.arguments())

    def run(self) -> Path | None:
        """Run it, its output on this process's; the results file it wrote, or None when it failed."""
        started = time.time()
        sys.stdout.flush()
        sys.stderr.flush()
        if wait(lm_eval_process(self.arguments())) != 0:
            return None
        return newest_results(self.output_path, started)

    def run_logged(self, log: Path, label: str) -> Path | None:
        """Run it with lm-eval's own output written to ``log`` and one progress bar on this terminal instead (the
        requests answered, read from lm-eval's own progress lines as they pass); the results file, or None when it
        failed, and then the log's last lines are shown."""
        import re

        from tqdm import tqdm

        log.parent.mkdir(parents=True, exist_ok=True)
        started = time.time()
        answered = re.compile(rb"generate_until:\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)")
        with open(log, "ab", buffering=0) as sink, tqdm(desc=label, unit="request", dynamic_ncols=True) as bar:
            sink.write(f"$ {self.shown()}\n".encode())
            read_end, write_end = os.pipe()
            with open(read_end, "rb", buffering=0) as errors:
                try:
                    process = lm_eval_process(self.arguments(), stdout=sink.fileno(), stderr=write_end)
                finally:
                    os.close(write_end)  # the run holds its own copy: the pipe ends when the run does
                with _killed_on_error(process):
                    while chunk := errors.read(1 << 16):
                        sink.write(chunk)  # O_APPEND: interleaved with what lm-eval writes to stdout, never over it
                        if found := answered.findall(chunk):
                            done, total = map(int, found[-1])
                            bar.total, bar.n = total, done
                            bar.refresh()
            code = wait(process)
        if code != 0:
            tail = log.read_text(errors="replace").splitlines()[-25:]
            print("\n".join(["lm_eval failed; the end of its log:", *tail, f"(all of it: {log})"]), flush=True)
            return None
        return newest_results(self.output_path, started)

    def run_or_raise(self, label: str) -> Path:
        """Show the command under ``label``, run it, and raise if it failed (lm_eval's output says why)."""
        print(f"\n{label}: {self.shown()}", flush=True)
        results = self.run()
        if results is None:
            raise RuntimeError(f"{label}: lm_eval failed (its output is above)")
        return results


def newest_results(folder: Path, since: float) -> Path | None:
    found = [p for p in Path(folder).glob("**/results_*.json") if p.stat().st_mtime >= since]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _quote(part: str) -> str:
    return repr(part) if any(c in part for c in " \n'\"{}") else part
