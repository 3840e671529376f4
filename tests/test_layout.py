"""The layout's promises, checked on the source: methods import no backend and no metric, the main job names no
method (a fourth method is one module and one registry line), and the installed package's imports form no cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

BACKENDS_PACKAGE = "decodebench.models.backends"


def backend_modules() -> tuple[str, ...]:
    """The backends' room: every backend, what they share, the served load and vLLM's CPU fix."""
    return (BACKENDS_PACKAGE,)


def test_every_backend_lives_in_the_backends_room():
    """A backend anywhere else would escape the checks below (a method importing it would not be caught)."""
    from decodebench.models.registry import BACKENDS

    outside = [target for target in BACKENDS.values() if not target.startswith(BACKENDS_PACKAGE + ".")]
    assert not outside, f"backends outside models/backends/: {outside}"
    room = {p.stem for p in (REPO / "models" / "backends").glob("*.py")}
    assert {"base", "hf", "vllm", "served"} <= room


def test_every_backend_runs_the_one_generate_until():
    """The skeleton (settings checked first, task by task, every answer cached as it comes, none missing) is written
    once, in models/backends/base.py; a backend writes only its steps."""
    from decodebench.models.backends.base import BackendLM
    from decodebench.models.registry import BACKENDS, load_backend

    own = {
        name: sorted({"generate_until", "batches", "generate_batch_measured"} & set(vars(load_backend(name))))
        for name in BACKENDS
        if name != "vllm"  # needs vLLM installed: its source is read below instead
    }
    assert all("generate_until" not in names and "generate_batch_measured" in names for names in own.values()), own
    for path in (REPO / "models" / "backends").glob("*.py"):
        if path.stem != "base":
            defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
            assert "generate_until" not in defined, f"{path.name} writes its own generate_until"
    assert "generate_until" in vars(BackendLM)


def backend_names_compared(path: Path) -> list[str]:
    """Backend names (``"vllm"``...) a file uses as values: in a comparison, a lookup, anywhere but the ``backends``
    declaration a method makes of where it runs. Messages that mention one are prose (only whole strings count)."""
    from decodebench.models.registry import BACKENDS

    tree = ast.parse(path.read_text())
    declared = {
        id(node)
        for assign in ast.walk(tree)
        if isinstance(assign, ast.Assign) and any(getattr(t, "id", None) == "backends" for t in assign.targets)
        for node in ast.walk(assign.value)
    }
    return [
        f"{path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in BACKENDS and id(node) not in declared
    ]


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
    folders = sorted(p for p in models.glob("*/*.py") if p.parent.name != "backends")
    return [*folders, models / "rows.py", models / "method.py", models / "baseline.py"]


def test_methods_import_no_backend_and_no_metric():
    offenders = {}
    for path in method_sources():
        bad = {
            module
            for module in imported_modules(path)
            if module.startswith(backend_modules()) or module.startswith("decodebench.metrics")
        }
        if bad:
            offenders[str(path.relative_to(REPO))] = sorted(bad)
    assert not offenders, f"methods must not import a backend or a metric: {offenders}"


def test_the_check_sees_an_offending_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from decodebench.models.backends.hf import HFBackend\n")
    assert "decodebench.models.backends.hf" in imported_modules(sample)


def test_methods_ask_backends_for_capabilities_not_names():
    """A method that needs something of its backend asks ``lm.capabilities`` (models/method.py), so that a new
    backend that can do the same needs no change to the method; the default ``backend="hf"`` of ``Method`` is the
    contract's own."""
    named = [
        hit
        for path in method_sources()
        if path.name != "method.py" or path.parent.name != "models"
        for hit in backend_names_compared(path)
    ]
    assert not named, f"methods name backends: {named}"


def test_the_name_check_sees_a_branch_on_a_backend_name(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        'class M:\n    backends = ("hf", "served")\n    def setup(self, lm):\n'
        '        if lm.backend_name == "served":\n            raise ValueError("not with backend=vllm")\n'
    )
    assert backend_names_compared(sample) == ["sample.py:4: 'served'"]


def test_the_main_job_names_no_method():
    from decodebench.models.registry import METHODS

    text = (REPO / "harness" / "commands" / "demo.py").read_text().lower()
    # "baseline" is also the word for what every comparison in its table is made against
    named = [name for name in METHODS if name != "baseline" and re.search(rf"\b{re.escape(name)}\b", text)]
    assert not named, f"harness/commands/demo.py names {named}: the demo must take its runs from the registry"


def import_graph(package: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports} for every module under ``package``: imports at module level, inside
    functions and for type checking alike (a lazy import is still a dependency); ``from pkg import sub`` is an edge
    to the submodule ``pkg.sub``, and to ``pkg`` itself only for names that are not submodules."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets |= {owner(f"{node.module}.{alias.name}") for alias in node.names}
        graph[name] = targets - {None, name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, as the modules along it (the first again at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_installed_packages_imports_form_no_cycle():
    import decodebench

    graph = import_graph(Path(decodebench.__file__).parent)
    assert len(graph) > 50 and "decodebench.models.registry" in graph["decodebench.models.method"]
    cycle = find_cycle(graph)
    assert cycle is None, "an import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_lazy_import_back(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub import b\n")  # a package and its own module: no cycle
    (package / "sub" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.b import B\n"
    )
    (package / "sub" / "b.py").write_text("class B:\n    def f(self):\n        from pkg.sub import a\n")
    graph = import_graph(package)
    assert graph["pkg.sub"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.a"}
    assert find_cycle(graph) == ["pkg.sub.b", "pkg.sub.a", "pkg.sub.b"]


SOURCE_FOLDERS = ("harness", "models", "kernels", "reports", "tasks", "studies", "tests")
# a path of ours, not the tail of another package's (lm_eval/models/...); vLLM's own test files, which
# tests/vllm_suite.py copies out of its source distribution, are theirs
CITED_FILE = re.compile(r"(?<![\w/])((?:" + "|".join(SOURCE_FOLDERS) + r")/[\w/.-]+\.py)\b")
VLLM_TESTS = REPO / "tests" / "vllm_suite.py"


def test_every_source_file_the_code_and_readme_cite_exists():
    """A docstring or the README pointing at a file that moved (the hf backend cited the method contract's file by
    a name it had lost long before) sends the next reader nowhere."""
    sources = (p for folder in SOURCE_FOLDERS for p in (REPO / folder).rglob("*.py") if p != VLLM_TESTS)
    texts = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *sources]
    missing = sorted(
        f"{path.relative_to(REPO)} cites {cited}"
        for path in texts
        for cited in CITED_FILE.findall(path.read_text())
        if not (REPO / cited).is_file()
    )
    assert not missing, "\n".join(missing)


# what a GPU machine accepts per command is 64 MiB of working tree, tracked files included: half of it stays free for
# what a command carries beside the tree (wheels, a model's config)
TRACKED_TREE_LIMIT = 32 * 2**20


def tracked_files() -> list[Path]:
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in listed.decode().split("\0") if name]


def test_the_tracked_tree_fits_beside_what_a_gpu_command_carries():
    sizes = {path: path.stat().st_size for path in tracked_files() if path.is_file()}
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total <= TRACKED_TREE_LIMIT, (
        f"tracked files take {total / 2**20:.1f} MiB, over {TRACKED_TREE_LIMIT / 2**20:.0f} MiB; the largest: "
        + ", ".join(f"{p.relative_to(REPO)} {sizes[p] / 2**20:.1f} MiB" for p in largest)
        + " (keep a run's per-document data compressed and once: studies/common.py, keep_lm_eval_run)"
    )


def test_no_kept_run_is_stored_twice_or_uncompressed():
    """One copy of each kept lm_eval run (the nugget studies share docs/data/nugget-runs), compressed."""
    import hashlib
    from collections import defaultdict

    data = [p for p in tracked_files() if p.is_relative_to(REPO / "docs" / "data") and p.is_file()]
    plain = [str(p.relative_to(REPO)) for p in data if re.fullmatch(r"(results_.*\.json|samples_.*\.jsonl)", p.name)]
    assert not plain, f"kept lm_eval files stored uncompressed: {plain[:5]}"
    copies = defaultdict(list)
    for path in data:
        if path.stat().st_size > 4096:
            copies[hashlib.sha256(path.read_bytes()).hexdigest()].append(str(path.relative_to(REPO)))
    repeated = [paths for paths in copies.values() if len(paths) > 1]
    assert not repeated, f"the same data stored more than once: {repeated[:3]}"


def test_every_kept_nugget_run_is_shown_by_a_page_and_records_the_study_command_that_made_it():
    """docs/data/nugget-runs holds what the nugget pages read and nothing else, and each run there was made by the
    study's own command (its maker file): a row no command in the repository makes is not recomputable (issue 66)."""
    import json

    store = REPO / "docs" / "data" / "nugget-runs"
    files = [p.relative_to(store) for p in tracked_files() if p.is_relative_to(store)]
    kept = {"/".join(path.parts[:2]) for path in files}
    shown = {
        where
        for runs in (REPO / "docs" / "data").glob("*/runs.json")
        for tasks in json.loads(runs.read_text()).values()
        for where in tasks.values()
    }
    assert kept == shown, f"shown by no page: {sorted(kept - shown)[:5]}; shown, not kept: {sorted(shown - kept)[:5]}"
    makers = {where: store / where / "made-by.json" for where in kept}
    unmade = sorted(where for where, maker in makers.items() if not maker.is_file())
    assert not unmade, f"kept runs without the study's maker file (rerun their page's command): {unmade[:5]}"
    commands = {json.loads(maker.read_text()).get("command", "").split(" --")[0] for maker in makers.values()}
    assert commands == {"python studies/nugget_study.py"}, commands


def test_no_page_names_a_scratch_path():
    """A page names what a reader can find: no /tmp path (the study's scratch folders on the machine it ran on)."""
    pages = [p for p in tracked_files() if p.suffix == ".md" and p.is_file()]
    named = [str(p.relative_to(REPO)) for p in pages if re.search(r"(?<![\w.])/tmp/", p.read_text())]
    assert not named, f"pages naming a /tmp path: {named}"


def test_the_vllm_extra_admits_every_validated_release_and_no_other():
    """pyproject's `vllm` extra and the plugins' guard (models/vllm_releases.py) name the same releases."""
    import tomllib

    from packaging.requirements import Requirement

    from decodebench.models.vllm_releases import VALIDATED_SERIES

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (requirement,) = map(Requirement, extras["vllm"])
    for series in VALIDATED_SERIES:
        assert requirement.specifier.contains(f"{series}.0") and requirement.specifier.contains(f"{series}.9")
    newer = f"0.{int(VALIDATED_SERIES[-1].split('.')[1]) + 1}.0"
    assert not requirement.specifier.contains(newer) and not requirement.specifier.contains("0.31.9")
