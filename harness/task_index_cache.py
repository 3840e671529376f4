"""A cache of lm-eval's built-in task index, so that every ``lm_eval`` process starts seconds sooner.

lm-eval 0.4.13's ``TaskManager`` parses all ~14,000 YAML files of its own task folder at every start
(6-8 s on two cores), for every model, decodebench's or not. Their parsed form depends only on
those files, so ``cached_index_build`` (installed on ``TaskIndex.build`` by the start-up hook)
keeps it in ``$DECODEBENCH_HOME/lm-eval-task-index/``, keyed by lm-eval's version and every
YAML file's path, size and modification time: any change to lm-eval's task folder makes a new
key, and other folders (decodebench's tasks, a user's ``--include_path``) are always parsed.
The index lm-eval builds is the same with or without it (tests/test_startup.py); a cache that
cannot be read or written is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import tempfile
from importlib.metadata import version
from pathlib import Path

log = logging.getLogger(__name__)


class _Failed:
    """A file lm-eval could not parse: its error is raised again, and lm-eval skips the file again."""

    def __init__(self, message: str):
        self.message = message


def _fingerprint(root: Path) -> str:
    digest = hashlib.sha256(version("lm_eval").encode())
    for path in sorted(root.glob("**/*yaml")):  # task files (.yaml) and the templates they include (_*_yaml)
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def _cache_file(root: Path) -> Path:
    from decodebench.paths import home

    return home() / "lm-eval-task-index" / f"{_fingerprint(root)}.pickle"


class YamlCache:
    """Parsed YAML files of one folder: read from the cache when its key matches, else parsed and saved."""

    def __init__(self, root: Path, load_yaml):
        self.root, self._load_yaml = f"{Path(root).resolve()}{os.sep}", load_yaml
        self.file = _cache_file(Path(root))
        self.parsed: dict[tuple, object] = {}
        self.hit = False
        with contextlib.suppress(Exception):
            self.parsed = pickle.loads(self.file.read_bytes())  # our own cache folder, written below
            self.hit = True

    def load_yaml(self, path, **kwargs):
        if not str(Path(path).expanduser().resolve()).startswith(self.root):
            return self._load_yaml(path, **kwargs)
        key = (str(path), tuple(sorted(kwargs.items())))
        if key not in self.parsed:
            try:
                self.parsed[key] = self._load_yaml(path, **kwargs)
            except Exception as exc:
                self.parsed[key] = _Failed(f"{type(exc).__name__}: {exc}")
        value = self.parsed[key]
        if isinstance(value, _Failed):
            raise ValueError(value.message)
        return value

    def save(self) -> None:
        if self.hit or not self.parsed:
            return
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.file.parent, delete=False, suffix=".partial") as handle:
                pickle.dump(self.parsed, handle, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(handle.name, self.file)
            for old in self.file.parent.glob("*.pickle"):  # indexes of lm-eval task folders that changed
                if old != self.file:
                    old.unlink(missing_ok=True)
        except OSError as exc:
            log.debug("lm-eval's task index was not cached: %s", exc)


def cached_index_build(index_module, original_build):
    """``TaskIndex.build`` that reads lm-eval's own task folder through a ``YamlCache``."""
    builtin = Path(index_module.__file__).resolve().parent

    def build(paths, *, resolve_includes=True):
        paths = list(paths)
        if builtin not in {Path(p).resolve() for p in paths}:
            return original_build(paths, resolve_includes=resolve_includes)
        real_load_yaml = index_module.load_yaml
        try:
            cache = YamlCache(builtin, real_load_yaml)
        except Exception as exc:  # a cache must never stop lm-eval
            log.debug("lm-eval's task index cache is unavailable: %s", exc)
            return original_build(paths, resolve_includes=resolve_includes)
        index_module.load_yaml = cache.load_yaml
        try:
            index = original_build(paths, resolve_includes=resolve_includes)
        finally:
            index_module.load_yaml = real_load_yaml
        cache.save()
        return index

    return build
