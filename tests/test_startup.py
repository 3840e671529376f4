"""The start-up hook: plain `lm_eval` sees our models and tasks; nothing heavy loads otherwise."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, offline_env

HEAVY = ("lm_eval", "torch", "transformers", "vllm")


def imported_modules(code: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        env=offline_env(),
        cwd=REPO.parent,
        check=True,
    )
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def test_plain_interpreter_imports_nothing_heavy_but_runs_the_hook():
    names = imported_modules("pass")
    assert "decodebench._startup" in names, "the .pth start-up hook did not run"
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert heavy == [], f"a plain `python -c pass` imported {heavy}"


def test_importing_decodebench_cli_and_metrics_stays_light():
    names = imported_modules("import decodebench.cli, decodebench.metrics, decodebench.measure.energy")
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert heavy == []


def test_registry_has_ours_and_lm_eval_builtins():
    code = (
        "from lm_eval.api.registry import get_model, model_registry\n"
        "from lm_eval.models.huggingface import HFLM\n"
        "print(get_model('baseline').method_target, get_model('hf') is HFLM, 'vllm' in model_registry)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=offline_env(), cwd=REPO.parent
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["decodebench.models.baseline:Baseline", "True", "True"]


def test_task_manager_finds_our_tasks_next_to_builtins_and_user_paths(tmp_path):
    user_task = tmp_path / "mine.yaml"
    user_task.write_text(
        "task: user_only_task\ndataset_path: json\noutput_type: generate_until\ndoc_to_text: x\ndoc_to_target: y\n"
    )
    code = (
        "from lm_eval.tasks import TaskManager\n"
        f"tm = TaskManager(include_path={str(tmp_path)!r})\n"
        "names = set(tm.all_tasks)\n"
        "print('squad_mini' in names, 'user_only_task' in names, 'hellaswag' in names)\n"
        "only = TaskManager(include_path=None, include_defaults=False)\n"
        "print(len(only.all_tasks))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=offline_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = proc.stdout.strip().splitlines()[-2:]
    assert first.split() == ["True", "True", "True"]
    assert second == "0", "include_defaults=False must not add our tasks either"
