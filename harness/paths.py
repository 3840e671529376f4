"""Where decodebench keeps what it builds once and reuses (the embedded model, indexes)."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "DECODEBENCH_HOME"
# The lm-eval task folder (YAMLs and bundled data), installed as decodebench/tasks.
TASKS_DIR = Path(__file__).resolve().parent / "tasks"


def home() -> Path:
    """The cache folder: ``$DECODEBENCH_HOME``, else the user's cache dir (``~/.cache/decodebench``)."""
    configured = os.environ.get(HOME_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("decodebench")).resolve()
