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
    names = imported_modules("import decodebench.commands.cli, decodebench.metrics, decodebench.measure.energy")
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert heavy == []


def test_registry_has_ours_and_lm_eval_builtins():
    """lm-eval's own entries stay what lm-eval registers (lazy "module:class" targets, read without importing
    torch: a fresh Python importing the HF stack costs ~9 s here; tests/test_lm_eval_cli.py runs `--model hf`)."""
    code = (
        "import sys\n"
        "from lm_eval.api.registry import get_model, model_registry\n"
        "target = get_model('baseline').method_target  # the first lookup fills the registry\n"
        "entries = dict(model_registry.items())\n"
        "print(target, entries['hf'], entries['vllm'], 'torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=offline_env(), cwd=REPO.parent
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-4:] == [
        "decodebench.models.baseline:Baseline",
        "lm_eval.models.huggingface:HFLM",
        "lm_eval.models.vllm_causallms:VLLM",
        "False",  # registering decodebench's models imports no model code
    ]


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


def test_lm_eval_task_index_cache_gives_the_same_index_and_follows_changes(tmp_path, monkeypatch):
    """The cache on lm-eval's real TaskIndex.build and load_yaml, over a small stand-in of its task folder."""
    from lm_eval.tasks import _index
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    from decodebench.lmeval.task_index_cache import YamlCache, cached_index_build

    monkeypatch.setenv("DECODEBENCH_HOME", str(tmp_path / "home"))
    root = tmp_path / "tasks"
    (root / "a").mkdir(parents=True)
    (root / "a" / "_template_yaml").write_text("output_type: generate_until\ndoc_to_text: '{{q}}'\n")
    (root / "a" / "one.yaml").write_text("include: _template_yaml\ntask: one\ntag: family\n")
    (root / "a" / "two.yaml").write_text("include: _template_yaml\ntask: two\ndoc_to_target: !function utils.t\n")
    (root / "a" / "broken.yaml").write_text("task: [unclosed\n")
    original = TaskIndex.__dict__["build"].__func__
    original = getattr(original, "__wrapped__", original)  # lm-eval's own, even with decodebench's hook on
    monkeypatch.setattr(_index, "__file__", str(root / "_index.py"))  # the stand-in is lm-eval's own folder
    build = cached_index_build(_index, original)

    def entries(index):
        return {name: (e.kind, e.yaml_path, e.cfg, e.tags) for name, e in index.items()}

    expected = entries(original([root]))
    assert set(expected) == {"one", "two", "family"}
    assert entries(build([root])) == expected  # parsed, then saved
    assert YamlCache(root, load_yaml).hit and _index.load_yaml is load_yaml
    assert entries(build([root])) == expected  # from the cache
    (root / "a" / "_template_yaml").write_text("output_type: generate_until\ndoc_to_text: '{{other}}'\n")
    changed = entries(build([root]))
    assert changed["one"][2]["doc_to_text"] == "{{other}}", "a changed template must not be read from the cache"
    assert changed == entries(original([root]))
    assert len(list((tmp_path / "home" / "lm-eval-task-index").glob("*.json"))) == 1


def test_two_lm_eval_installations_sharing_a_home_keep_their_own_task_index_caches(tmp_path, monkeypatch):
    """tox's environments share one DECODEBENCH_HOME: each one's lm-eval must not evict the other's cache (it did, so
    every lm_eval process after a switch parsed ~14,000 files again, 5-6 s)."""
    from lm_eval.tasks import _index
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    from decodebench.lmeval.task_index_cache import YamlCache, cached_index_build

    monkeypatch.setenv("DECODEBENCH_HOME", str(tmp_path / "home"))
    original = TaskIndex.__dict__["build"].__func__
    original = getattr(original, "__wrapped__", original)
    roots = [tmp_path / "env-a" / "tasks", tmp_path / "env-b" / "tasks"]
    for root in roots:
        root.mkdir(parents=True)
        (root / "one.yaml").write_text("task: one\ndoc_to_text: '{{q}}'\n")
        monkeypatch.setattr(_index, "__file__", str(root / "_index.py"))
        cached_index_build(_index, original)([root])
    assert all(YamlCache(root, load_yaml).hit for root in roots)
    assert len(list((tmp_path / "home" / "lm-eval-task-index").glob("*.json"))) == 2


def test_a_process_builds_an_unchanged_index_once_and_logs_its_warnings_at_every_use(tmp_path, monkeypatch):
    """The fork server builds lm-eval's task index as it starts (decodebench.lmeval.task_index_warm), quietly; each
    run forked from it gets that index, and the warnings lm-eval logged building it (a task of ours overriding one of
    lm-eval's) in its own log. A changed file in any folder walked builds the index again."""
    import logging

    from lm_eval.tasks import _index
    from lm_eval.tasks._index import TaskIndex

    from decodebench.lmeval import task_index_cache

    monkeypatch.setenv("DECODEBENCH_HOME", str(tmp_path / "home"))
    builtin, ours = tmp_path / "lm_eval_tasks", tmp_path / "ours"
    for root in (builtin, ours):
        root.mkdir()
        (root / "one.yaml").write_text(f"task: one\ndoc_to_text: '{root.name}'\n")
    original = TaskIndex.__dict__["build"].__func__
    original = getattr(original, "__wrapped__", original)
    walked = []

    def walking(paths, **kwargs):
        walked.append(list(paths))
        return original(paths, **kwargs)

    monkeypatch.setattr(_index, "__file__", str(builtin / "_index.py"))
    build = task_index_cache.cached_index_build(_index, walking)

    class Logged(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    logged = Logged()
    _index.log.addHandler(logged)
    try:
        monkeypatch.setattr(task_index_cache, "_quiet", True)  # as warm() builds it
        first = build([builtin, ours])
        assert first["one"].cfg["doc_to_text"] == "ours" and _index.log.propagate  # left as it was
        monkeypatch.setattr(task_index_cache, "_quiet", False)
        first["added"] = first["one"]  # lm-eval adds namespaced tasks to the index it is given
        for _ in range(2):
            logged.lines.clear()
            again = build([builtin, ours])
            assert set(again) == {"one"} and again["one"].cfg["doc_to_text"] == "ours"
            assert len(logged.lines) == 1 and "Task 'one' from" in logged.lines[0] and "overrides" in logged.lines[0]
        assert len(walked) == 1
        (ours / "one.yaml").write_text("task: one\ndoc_to_text: 'changed'\n")
        assert build([builtin, ours])["one"].cfg["doc_to_text"] == "changed" and len(walked) == 2
    finally:
        _index.log.removeHandler(logged)


class _Planted:
    """A pickle that, loaded, writes a file: what someone able to write a shared DECODEBENCH_HOME could plant."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_in_the_task_index_cache_runs_nothing_and_is_replaced(tmp_path, monkeypatch):
    import pickle

    from lm_eval.tasks import _index
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    from decodebench.lmeval import task_index_cache
    from decodebench.lmeval.task_index_cache import YamlCache, cached_index_build

    monkeypatch.setenv("DECODEBENCH_HOME", str(tmp_path / "home"))
    root = tmp_path / "tasks"
    root.mkdir()
    (root / "one.yaml").write_text("task: one\ndoc_to_text: '{{q}}'\n")
    (root / "dated.yaml").write_text("task: dated\nmetadata: {released: 2024-01-31}\n")  # a date: not JSON
    original = TaskIndex.__dict__["build"].__func__
    original = getattr(original, "__wrapped__", original)
    monkeypatch.setattr(_index, "__file__", str(root / "_index.py"))
    cache_file = task_index_cache._cache_file(root)
    cache_file.parent.mkdir(parents=True)
    marker = tmp_path / "planted-code-ran"
    for planted in (cache_file, cache_file.with_suffix(".pickle")):  # today's name, and the name pickles had
        planted.write_bytes(pickle.dumps(_Planted(marker)))

    def entries(index):
        return {name: (e.kind, e.yaml_path, e.cfg) for name, e in index.items()}

    build = cached_index_build(_index, original)
    assert entries(build([root])) == entries(original([root]))
    assert not marker.exists()
    assert sorted(p.name for p in cache_file.parent.iterdir()) == [cache_file.name]  # rebuilt; the pickle gone
    cache = YamlCache(root, load_yaml)
    assert cache.hit and [key[0] for key in cache.parsed] == [str(root / "one.yaml")]  # the date is parsed each time
    assert entries(build([root])) == entries(original([root]))
    assert (cache_file.stat().st_mode & 0o077) == 0  # the owner's alone
