"""Shared helpers: the real `lm_eval` command in a subprocess, offline, and its output files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


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
    return run_command([console_script("lm_eval"), *args], cwd=cwd, timeout=timeout, **env)


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


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="session")
def embedded_checkpoint() -> Path:
    """The embedded model, materialized once per cache folder (DECODEBENCH_HOME)."""
    from decodebench.embedded import ensure_embedded_model

    return ensure_embedded_model()
