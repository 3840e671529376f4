"""`decodebench compare`: rounds of alternating order through the real lm_eval, a speed ratio paired per document."""

from __future__ import annotations

import json

import pytest
from conftest import console_script, explain, run_command
from test_reports import BASE, BETTER, results_file

from decodebench.compare import backend_args, parse_model_args, summarize


def test_the_speed_ratio_is_paired_per_document_over_the_rounds_and_quality_is_paired(tmp_path):
    rounds = []
    for number, (base_seconds, method_seconds) in enumerate([(10.0, 5.0), (10.0, 4.0), (20.0, 5.0)], 1):
        rounds.append(
            {
                "baseline": results_file(
                    tmp_path / f"r{number}b", "baseline", {"squad_mini": (BASE, 100, base_seconds)}
                ),
                "method": results_file(tmp_path / f"r{number}m", "lz", {"squad_mini": (BETTER, 100, method_seconds)}),
            }
        )
    summary = summarize(rounds)["squad_mini"]
    assert summary["round_speed_ratios"] == pytest.approx([2.0, 2.5, 4.0])
    # each document: the same tokens on both sides, 40 s of baseline over 14 s of method, summed over the rounds
    assert summary["speed_ratio"] == pytest.approx(40 / 14) and summary["speed_ratio_documents"] == 40
    assert summary["speed_ratio_interval"] == pytest.approx([40 / 14, 40 / 14])
    comparison = summary["quality"]["normalized_accuracy"]["vs_baseline"]
    assert comparison["difference"] == pytest.approx(0.3) and comparison["p_value"] < 0.05


def test_both_sides_arguments_are_checked_before_anything_runs(tmp_path):
    proc = run_command(
        [
            console_script("decodebench"),
            *("compare", "--model", "lz", "--model-args", "pretrained=embedded,strength=nan", "--tasks", "squad_mini"),
            *("--out", str(tmp_path / "compare")),
        ],
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2 and "the method's --model_args: strength=nan: must be a finite number" in proc.stderr
    assert not (tmp_path / "compare").exists(), "nothing may run before both sides are checked"
    bad_baseline = run_command(
        [
            console_script("decodebench"),
            *("compare", "--model", "lz", "--baseline-args", "pretrained=embedded,windw=3", "--tasks", "squad_mini"),
        ],
        cwd=tmp_path,
        timeout=120,
    )
    assert bad_baseline.returncode == 2 and "the baseline's --model_args: Unknown model argument" in bad_baseline.stderr


def test_the_baseline_gets_the_methods_arguments_that_are_not_its_own():
    args = parse_model_args("pretrained=/m,backend=vllm,gpu_memory_utilization=0.3,strength=0.2,window=64")
    assert backend_args("lz", args) == {"pretrained": "/m", "backend": "vllm", "gpu_memory_utilization": "0.3"}
    with pytest.raises(ValueError, match="not a decodebench method"):
        backend_args("hf", args)
    with pytest.raises(ValueError, match="key=value"):
        parse_model_args("strength")


@pytest.mark.model
@pytest.mark.slow
def test_compare_runs_baseline_and_method_interleaved_through_lm_eval(tiny_checkpoint, tmp_path):
    out = tmp_path / "compare"
    proc = run_command(
        [
            console_script("decodebench"),
            *("compare", "--model", "lz", "--model-args", f"pretrained={tiny_checkpoint}", "--tasks", "squad_mini"),
            *("--limit", "2", "--rounds", "2", "--gen-kwargs", "max_gen_toks=6", "--out", str(out)),
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, explain(proc)
    order = [line.split("] ")[1].split(":")[0] for line in proc.stdout.splitlines() if line.startswith("[round ")]
    assert order == ["baseline", "method", "method", "baseline"]  # A B, B A
    summary = json.loads((out / "compare.json").read_text())["squad_mini"]
    assert len(summary["round_speed_ratios"]) == 2 and summary["n"] == 2 and summary["speed_ratio_documents"] == 2
    low, high = summary["speed_ratio_interval"]
    assert low <= summary["speed_ratio"] <= high
    assert "speed ratio [95% CI]" in (out / "compare.md").read_text()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--concurrency", "0,4"], "comma-separated whole numbers >= 1"),
        (["--concurrency", "1,four"], "comma-separated whole numbers >= 1"),
        (["--rounds", "0"], "--rounds must be at least 1"),
    ],
)
def test_a_sweep_with_a_bad_load_says_what_is_allowed_before_running(flags, message, tmp_path):
    proc = run_command(
        [
            *(console_script("decodebench"), "sweep", "--model", "lz", "--base-url", "http://127.0.0.1:9/v1"),
            *("--tasks", "squad_mini", *flags),
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and message in proc.stderr, explain(proc)
