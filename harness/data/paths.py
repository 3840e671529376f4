"""Where decodebench keeps what it builds once and reuses (the embedded model, indexes)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

HOME_ENV = "DECODEBENCH_HOME"
# The lm-eval task folder (YAMLs and bundled data), installed as decodebench/tasks.
TASKS_DIR = Path(__file__).resolve().parents[1] / "tasks"  # decodebench/tasks, beside data/


def home() -> Path:
    """The cache folder: ``$DECODEBENCH_HOME``, else the user's cache dir (``~/.cache/decodebench``)."""
    configured = os.environ.get(HOME_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("decodebench")).resolve()


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks (what is built once is checked against it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
