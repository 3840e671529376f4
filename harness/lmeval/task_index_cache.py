"""A cache of lm-eval's built-in task index, so that every ``lm_eval`` process starts seconds sooner.

lm-eval 0.4.13's ``TaskManager`` parses all ~14,000 YAML files of its own task folder at every start
(6-8 s on two cores), for every model, decodebench's or not. Their parsed form depends only on
those files, so ``cached_index_build`` (installed on ``TaskIndex.build`` by the start-up hook)
keeps it in ``$DECODEBENCH_HOME/lm-eval-task-index/``, keyed by lm-eval's version and every
YAML file's path, size and modification time: any change to lm-eval's task folder makes a new
key, and other folders (decodebench's tasks, a user's ``--include_path``) are always parsed.
Each lm-eval installation (each virtual environment) has its own file, named after its folder,
so environments sharing one ``DECODEBENCH_HOME`` (tox's do) never evict each other's.
The index lm-eval builds is the same with or without it (tests/test_startup.py); a cache that
cannot be read or written is ignored, and one that does not parse as this module's JSON is rebuilt.

A process also keeps the indexes it built, by the folders walked and the same key of each (path, size and
modification time of every YAML file), so a second build over unchanged folders costs only those keys. The fork
server every decodebench command forks its ``lm_eval`` runs from builds the index as it starts
(``decodebench.lmeval.task_index_warm``), so a run starts with it instead of walking the folders again; the
warnings lm-eval logged while building it (a task of decodebench's that overrides one of lm-eval's) are logged again
in each run that reuses it.

The cache is JSON, never pickle: whoever can write ``DECODEBENCH_HOME`` (a shared cache folder on a cluster) must not
be able to run code in every ``lm_eval`` process that reads it. A YAML value JSON cannot give back unchanged (a date,
a non-string key) is not cached: its file is parsed at every start, as without the cache. Files are written to a
private temporary file (the owner's permissions only) and renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

log = logging.getLogger(__name__)


FORMAT = 1


class _Failed:
    """A file lm-eval could not parse: its error is raised again, and lm-eval skips the file again."""

    def __init__(self, message: str):
        self.message = message


def _plain(value) -> bool:
    """Whether JSON gives ``value`` back equal and of the same types (what the cache may hold)."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _plain(item) for key, item in value.items())
    return False


def _encode(parsed: dict) -> str:
    rows = []
    for (path, kwargs), value in parsed.items():
        if isinstance(value, _Failed):
            rows.append({"path": path, "kwargs": dict(kwargs), "error": value.message})
        elif _plain(value):
            rows.append({"path": path, "kwargs": dict(kwargs), "value": value})
    return json.dumps({"format": FORMAT, "files": rows})


def _decode(text: str) -> dict:
    """The parsed files a cache holds; ``ValueError`` when it is not this module's JSON."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), list):
        raise ValueError("not a task index cache of this format")
    parsed = {}
    for row in data["files"]:
        if not (isinstance(row, dict) and isinstance(row.get("path"), str) and isinstance(row.get("kwargs"), dict)):
            raise ValueError("a malformed entry")
        key = (row["path"], tuple(sorted(row["kwargs"].items())))
        if isinstance(row.get("error"), str):
            parsed[key] = _Failed(row["error"])
        elif isinstance(row.get("value"), dict):
            parsed[key] = row["value"]
        else:
            raise ValueError("an entry with neither a value nor an error")
    return parsed


def _fingerprint(root: Path) -> str:
    """lm-eval's version and every YAML file's path, size and modification time under ``root``: task files
    (``.yaml``) and the templates they include (``_*_yaml``). Walked with ``os.scandir``, which hands each entry's
    type over with the listing (every run computes it over lm-eval's 14,000 files; ``Path.glob`` took longer)."""
    rows, folders = [], [os.fspath(root)]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):  # as Path.glob's "**": no loop through a link
                    folders.append(entry.path)
                elif entry.name.endswith("yaml"):
                    stat = entry.stat()
                    rows.append(f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}\n")
    digest = hashlib.sha256(version("lm_eval").encode())
    digest.update("".join(sorted(rows)).encode())
    return digest.hexdigest()[:24]


def _installation(root: Path) -> str:
    """The name that tells one lm-eval installation's cache files from another's."""
    return hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:12]


def _cache_file(root: Path, fingerprint: str | None = None) -> Path:
    from decodebench.data.paths import home

    return home() / "lm-eval-task-index" / f"{_installation(root)}-{fingerprint or _fingerprint(root)}.json"


class YamlCache:
    """Parsed YAML files of one folder: read from the cache when its key matches, else parsed and saved."""

    def __init__(self, root: Path, load_yaml, fingerprint: str | None = None):
        self.root, self._load_yaml = f"{Path(root).resolve()}{os.sep}", load_yaml
        self.file = _cache_file(Path(root), fingerprint)
        self.parsed: dict[tuple, object] = {}
        self.hit = False
        with contextlib.suppress(OSError, ValueError, TypeError, RecursionError):  # unreadable: rebuilt below
            self.parsed = _decode(self.file.read_text(encoding="utf-8"))
            self.hit = True

    def _inside(self, path) -> bool:
        text = str(path)
        if text.startswith(self.root) and ".." not in text:  # what lm-eval's walk gives: no resolve() needed
            return True
        return str(Path(path).expanduser().resolve()).startswith(self.root)

    def load_yaml(self, path, **kwargs):
        if not self._inside(path):
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
            with tempfile.NamedTemporaryFile(
                "w", encoding="utf-8", dir=self.file.parent, delete=False, suffix=".partial"
            ) as handle:
                handle.write(_encode(self.parsed))
            os.replace(handle.name, self.file)
            # this installation's indexes of task folders that changed (other installations keep theirs), files
            # named as before installations had their own (unprefixed), and pickles of earlier versions (never read)
            installation = self.file.name.split("-")[0]
            for old in [*self.file.parent.glob("*.json"), *self.file.parent.glob("*.pickle")]:
                if old != self.file and (old.name.startswith(f"{installation}-") or "-" not in old.stem):
                    old.unlink(missing_ok=True)
        except OSError as exc:
            log.debug("lm-eval's task index was not cached: %s", exc)


# this process's indexes: {(folders, resolve_includes, their keys): (index, the warnings lm-eval logged building it)}
_BUILT: dict[tuple, tuple[dict, list[logging.LogRecord]]] = {}
_quiet = False  # warm(): the warnings are kept for the runs, not printed


def cached_index_build(index_module, original_build):
    """``TaskIndex.build`` that reads lm-eval's own task folder through a ``YamlCache``, and gives an index this
    process built over the same unchanged folders again."""
    builtin = Path(index_module.__file__).resolve().parent

    def build(paths, *, resolve_includes=True):
        paths = list(paths)
        resolved = [Path(p).resolve() for p in paths]
        if builtin not in resolved:
            return original_build(paths, resolve_includes=resolve_includes)
        logger = logging.getLogger(index_module.__name__)  # lm-eval's index logs through its module's logger
        try:
            fingerprints = tuple(_fingerprint(Path(p)) for p in paths)
        except OSError as exc:  # a folder that cannot be walked: lm-eval says what it finds
            log.debug("lm-eval's task index cache is unavailable: %s", exc)
            return original_build(paths, resolve_includes=resolve_includes)
        key = (tuple(str(p) for p in paths), resolve_includes, fingerprints)
        if key in _BUILT:
            index, warnings = _BUILT[key]
            _log_again(logger, warnings)
            return dict(index)  # lm-eval adds entries to the dict (namespaced tasks), never to an entry's config
        real_load_yaml = index_module.load_yaml
        try:
            cache = YamlCache(builtin, real_load_yaml, fingerprints[resolved.index(builtin)])
        except Exception as exc:  # a cache must never stop lm-eval
            log.debug("lm-eval's task index cache is unavailable: %s", exc)
            return original_build(paths, resolve_includes=resolve_includes)
        index_module.load_yaml = cache.load_yaml
        try:
            index, warnings = _build_keeping_warnings(logger, original_build, paths, resolve_includes)
        finally:
            index_module.load_yaml = real_load_yaml
        cache.save()
        _BUILT[key] = dict(index), warnings
        return index

    return build


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _build_keeping_warnings(logger: logging.Logger, original_build, paths, resolve_includes):
    kept, saved = _Kept(), (logger.propagate, logger.level)
    logger.addHandler(kept)
    if _quiet:
        logger.propagate, logger.level = False, logging.WARNING
    try:
        index = original_build(paths, resolve_includes=resolve_includes)
    finally:
        logger.removeHandler(kept)
        logger.propagate, logger.level = saved
    return index, kept.records


def _log_again(logger: logging.Logger, records: list[logging.LogRecord]) -> None:
    now = time.time()
    for record in records:
        if logger.isEnabledFor(record.levelno):
            logger.handle(logging.makeLogRecord({**record.__dict__, "created": now, "msecs": now % 1 * 1000}))


def warm() -> None:
    """Build lm-eval's task index in this process, as every ``lm_eval`` run does: its cache file is written (a new
    installation's first build parses all ~14,000 YAML files, 10-16 s on two cores), and the runs forked from this
    process start with the index built. lm-eval's warnings about the index (tasks that override others) belong to
    the runs' logs, not here: they are logged in each run."""
    global _quiet

    from lm_eval.tasks import TaskManager

    _quiet = True
    try:
        TaskManager()
    finally:
        _quiet = False
