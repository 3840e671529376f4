"""The layout's promises, checked on the source: methods import no backend and no metric, and the main
job names no method (a fourth method is one module and one registry line)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

BACKEND_MODULES = ("decodebench.models.hf", "decodebench.models.vllm")


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def method_sources() -> list[Path]:
    models = REPO / "models"
    return [*sorted(p for p in models.glob("*/*.py")), models / "rows.py", models / "method.py", models / "baseline.py"]


def test_methods_import_no_backend_and_no_metric():
    offenders = {}
    for path in method_sources():
        bad = {
            module
            for module in imported_modules(path)
            if module.startswith(BACKEND_MODULES) or module.startswith("decodebench.metrics")
        }
        if bad:
            offenders[str(path.relative_to(REPO))] = sorted(bad)
    assert not offenders, f"methods must not import a backend or a metric: {offenders}"


def test_the_check_sees_an_offending_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from decodebench.models.hf import HFBackend\n")
    assert "decodebench.models.hf" in imported_modules(sample)


def test_the_main_job_names_no_method():
    from decodebench.models.registry import METHODS

    text = (REPO / "harness" / "demo.py").read_text().lower()
    # "baseline" is also the word for what every comparison in its table is made against
    named = [name for name in METHODS if name != "baseline" and re.search(rf"\b{re.escape(name)}\b", text)]
    assert not named, f"harness/demo.py names {named}: the demo must take its runs from the registry"
