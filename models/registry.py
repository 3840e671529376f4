"""The methods that ``lm_eval --model NAME`` knows, written once.

Each entry is a ``"module:Class"`` of a ``decodebench.models.method.Method`` subclass, imported only
when lm-eval builds that model. Other packages add methods through the ``decodebench.methods``
entry-point group, e.g. in their pyproject.toml::

    [project.entry-points."decodebench.methods"]
    mymethod = "mypackage.mymethod:MyMethod"
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

METHODS = {
    "baseline": "decodebench.models.baseline:Baseline",
    "lz": "decodebench.models.lz:LZ",
    "mtad": "decodebench.models.mtad:MTAD",
    "nugget": "decodebench.models.nugget:Nugget",
}
ENTRY_POINT_GROUP = "decodebench.methods"


def methods() -> dict[str, str]:
    """Every registered method: decodebench's own, then those of installed packages."""
    found = dict(METHODS)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry.value)
    return found


def load_method(target: str) -> type:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
