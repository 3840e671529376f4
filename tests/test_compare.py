"""`decodebench compare`: interleaved rounds through the real lm_eval, the ratio's median and range."""

from __future__ import annotations

import json

import pytest
from conftest import console_script, explain, run_command
from test_reports import BASE, BETTER, results_file

from decodebench.compare import backend_args, parse_model_args, summarize


def test_the_speed_ratio_is_the_median_and_range_of_the_rounds_and_quality_is_paired(tmp_path):
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
    assert summary["speed_ratios"] == pytest.approx([2.0, 2.5, 4.0])
    assert summary["speed_ratio_median"] == pytest.approx(2.5) and summary["speed_ratio_range"] == pytest.approx(
        [2.0, 4.0]
    )
    comparison = summary["quality"]["normalized_accuracy"]["vs_baseline"]
    assert comparison["difference"] == pytest.approx(0.3) and comparison["p_value"] < 0.05


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
    assert order == ["baseline", "method", "baseline", "method"]  # A B A B
    summary = json.loads((out / "compare.json").read_text())["squad_mini"]
    assert len(summary["speed_ratios"]) == 2 and summary["n"] == 2
    assert "speed ratio: median [range]" in (out / "compare.md").read_text()
