"""How decodebench's commands run lm_eval (decodebench.commands.runs): each run in a process of its own, forked from
one that has imported lm-eval, torch and transformers once, with the run's own output and exit code."""

from __future__ import annotations

import os
import sys

import pytest
from conftest import explain, run_command

# No `if __name__ == "__main__":` guard: were the script run again in the run's process (what multiprocessing does
# with a parent's main script), it would print its first line twice and start its run over.
SCRIPT = """
import sys
from pathlib import Path

from decodebench.commands.runs import LmEvalRun

print("script started", flush=True)
run = LmEvalRun("baseline", ["squad_mini"], Path(sys.argv[1]), model_args={"pretrained": "embedded", "windw": 3})
print("results:", run.run(), flush=True)
"""


def test_a_script_without_a_main_guard_runs_its_lm_eval_once_and_sees_its_failure(embedded_checkpoint, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = run_command([sys.executable, str(script), str(tmp_path / "out")], cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert proc.stdout.count("script started") == 1, explain(proc)
    assert "results: None" in proc.stdout  # lm_eval's exit code reached the script
    assert "windw" in proc.stderr, explain(proc)  # lm_eval's own message, on the script's stderr


def test_a_run_that_needs_other_start_up_settings_is_refused_before_it_starts():
    from decodebench.commands.runs import lm_eval_process

    with pytest.raises(ValueError, match=r"\['PYTHONPATH'\]"):
        lm_eval_process(["--tasks", "squad_mini"], env={**os.environ, "PYTHONPATH": "/elsewhere"})


# A process forked after CUDA was initialized cannot use CUDA: such a run must start a fresh Python. No GPU here, so
# torch is told it is in that state.
AFTER_CUDA = """
import os
import sys

import torch

torch.cuda._is_in_bad_fork = lambda: True
from decodebench.commands.runs import _lm_eval_main

try:
    _lm_eval_main(["--help"], os.getcwd(), dict(os.environ), os.dup(1), os.dup(2))
except SystemExit:
    print("lm_eval ran in the forked process")
"""


def test_a_run_forked_after_cuda_was_initialized_starts_a_fresh_python(tmp_path):
    proc = run_command([sys.executable, "-c", AFTER_CUDA], cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert "usage: lm-eval" in proc.stdout and "ran in the forked process" not in proc.stdout, explain(proc)


def test_a_forked_call_returns_its_value_and_raises_its_exception_here():
    from decodebench.commands.runs import forked_call

    assert forked_call(int, "42") == 42
    with pytest.raises(ValueError, match="invalid literal for int"):
        forked_call(int, "forty-two")


def _what_a_run_starts_with(modules: list[str]) -> tuple[int, list[str]]:
    import gc

    return gc.get_freeze_count(), [module for module in modules if module not in sys.modules]


def test_a_run_starts_with_its_imports_made_and_the_servers_objects_frozen():
    """What the fork server prepares for each run (studies/fork_server_bench.py measures what it saves): the imports
    every run makes, already made, and the server's objects (torch's, transformers', lm-eval's: hundreds of thousands)
    out of the garbage collector's sight, so that a run's collections walk only what the run made."""
    from decodebench.commands.runs import RUN_IMPORTS, forked_call

    frozen, not_imported = forked_call(_what_a_run_starts_with, RUN_IMPORTS)
    assert not_imported == []
    assert frozen > 100_000, frozen
