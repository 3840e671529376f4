"""The methods that ``lm_eval --model NAME`` knows and the backends they run on (``backend=NAME``), written once.

Each entry is a ``"module:Class"`` of a ``decodebench.models.method.Method`` subclass, imported only
when lm-eval builds that model. Other packages add methods through the ``decodebench.methods``
entry-point group, e.g. in their pyproject.toml::

    [project.entry-points."decodebench.methods"]
    mymethod = "mypackage.mymethod:MyMethod"

The backends are ``"module:Class"`` entries too, imported only when asked for (vLLM may not be installed); this
module imports nothing of decodebench's, so the method contract reads the table without an import cycle.
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
BACKENDS = {
    "hf": "decodebench.models.backends.hf:HFBackend",
    "vllm": "decodebench.models.backends.vllm:VLLMBackend",
    "served": "decodebench.models.backends.served:ServedBackend",
}


def methods() -> dict[str, str]:
    """Every registered method: decodebench's own, then those of installed packages."""
    found = dict(METHODS)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry.value)
    return found


def load_method(target: str) -> type:
    """The class a ``"module:Class"`` entry names, its module imported now."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_backend(name: str) -> type:
    return load_method(BACKENDS[name])
