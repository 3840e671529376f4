"""Running the real ``lm_eval`` command, offline, and finding what it wrote.

The main job (``decodebench demo``), the studies under studies/ and the interleaved comparisons
all run lm-eval the way a user does: ``python -m lm_eval --model ... --output_path ...`` in a
subprocess of the current interpreter, with the hub switched off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


def offline_env() -> dict[str, str]:
    """Nothing may reach the Hugging Face hub: models and data are local."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


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

    def command(self) -> list[str]:
        args = ",".join(f"{key}={value}" for key, value in self.model_args.items())
        command = [sys.executable, "-m", "lm_eval", "--model", self.model]
        if args:
            command += ["--model_args", args]
        command += ["--tasks", ",".join(self.tasks), "--batch_size", str(self.batch_size)]
        command += ["--output_path", str(self.output_path)]
        if self.limit is not None:
            command += ["--limit", str(self.limit)]
        if self.gen_kwargs:
            command += ["--gen_kwargs", self.gen_kwargs]
        if self.chat_template:
            command.append("--apply_chat_template")
        if self.log_samples:
            command.append("--log_samples")
        return [*command, *self.extra]

    def shown(self) -> str:
        """The command as a user would type it."""
        return "lm_eval " + " ".join(_quote(part) for part in self.command()[3:])

    def run(self) -> Path | None:
        """Run it; the results file it wrote, or None when it failed."""
        started = time.time()
        if subprocess.call(self.command(), env=offline_env()) != 0:
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
            process = subprocess.Popen(self.command(), env=offline_env(), stdout=sink, stderr=subprocess.PIPE)
            try:
                while chunk := process.stderr.read1(1 << 16):
                    sink.write(chunk)  # O_APPEND: interleaved with what lm-eval writes to stdout, never over it
                    if found := answered.findall(chunk):
                        done, total = map(int, found[-1])
                        bar.total, bar.n = total, done
                        bar.refresh()
                code = process.wait()
            except BaseException:  # Ctrl-C (lm_eval got it too): nothing of it outlives this run
                process.kill()
                process.wait()
                raise
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
