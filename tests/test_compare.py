"""`decodebench compare`: rounds of alternating order through the real lm_eval, a speed ratio paired per document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import decodebench_in_process, explain
from test_reports import BASE, BETTER, results_file

from decodebench.commands.compare import summarize
from decodebench.commands.sides import SIDES, backend_args, parse_model_args


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


def with_generations(results: Path, task: str, generations: list[str]) -> Path:
    """The results' samples log with each document's generation, as lm-eval logs it (``resps``)."""
    (samples,) = results.parent.glob(f"samples_{task}_*.jsonl")
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    samples.write_text(
        "".join(json.dumps({**line, "resps": [[text]]}) + "\n" for line, text in zip(lines, generations, strict=True))
    )
    return results


def test_rounds_pair_on_the_tasks_every_round_ran_and_count_the_baselines_generations(tmp_path):
    """The main job's second round runs one task: the comparison covers that task alone; the same generations
    are counted per document from the samples logs."""
    two_tasks = {"squad_mini": (BASE, 100, 10.0), "cnndm_mini": (BASE, 100, 10.0)}
    texts = [f"answer {i}" for i in range(len(BASE))]
    changed = ["other"] * 3 + texts[3:]
    first = {
        "baseline": with_generations(results_file(tmp_path / "b1", "baseline", two_tasks), "squad_mini", texts),
        "method": with_generations(results_file(tmp_path / "m1", "mtad", two_tasks), "squad_mini", changed),
    }
    second = {side: results_file(tmp_path / f"{side}2", side, {"squad_mini": (BASE, 100, 10.0)}) for side in SIDES}
    summary = summarize([first, second])
    assert list(summary) == ["squad_mini"]
    assert summary["squad_mini"]["identical_generations"] == (len(BASE) - 3, len(BASE))
    assert summary["squad_mini"]["speed_ratio_documents"] == len(BASE)


def test_compare_shows_no_speed_interval_below_10_documents(tmp_path):
    """A bootstrap over fewer than 10 documents is not calibrated: compare.md gives the ratio and each round's, and
    says why there is no interval; from 10 documents on, the interval."""
    from decodebench.commands.compare import markdown

    def speed_cell(documents: int) -> str:
        task = {"squad_mini": (BASE[:documents], 100, 10.0)}
        produced = {side: results_file(tmp_path / f"{side}{documents}", side, task) for side in SIDES}
        table = markdown(summarize([produced]), "mtad", {}, 1)
        return next(line for line in table.splitlines() if line.startswith("| squad_mini")).split(" | ")[2]

    assert speed_cell(3) == "1.00x (no CI, n < 10)"
    assert speed_cell(len(BASE)) == "1.00x [1.00, 1.00]"


def test_the_main_job_says_in_words_what_a_comparison_can_and_cannot_tell():
    from decodebench.commands.demo import COMPARED_LIMIT, what_it_tells
    from decodebench.stats import APPROXIMATE_BELOW

    row = {
        "identical_generations": (2, 2),
        "speed_ratio": 0.76,
        "speed_ratio_interval": [0.7, 0.8],
        "speed_ratio_documents": 20,
        "round_speed_ratios": [0.75, 0.77],
        "quality": {"rougeLsum": {"vs_baseline": {"difference": 0.0, "p_value": 1.0}}},
        "n": 2,
    }
    same, speed = what_it_tells(row)
    assert "baseline's on 2 of 2 documents" in same and "slower" in speed and "excludes 1" in speed
    # a bootstrap over 2 documents is not calibrated: no speed claim, whatever its interval says
    (_, few) = what_it_tells({**row, "speed_ratio_documents": 2})
    # the main job's own comparison takes enough documents for its interval to be shown
    assert COMPARED_LIMIT >= APPROXIMATE_BELOW
    assert "not calibrated" in few and "slower" not in few and "0.75x, 0.77x" in few
    differing = {**row, "identical_generations": (1, 2), "speed_ratio_interval": [0.9, 1.2]}
    differ, speed, quality = what_it_tells(differing)
    assert "differ from the baseline's on 1 of 2" in differ and "includes 1" in speed
    assert "rougeLsum: p = 1 at n = 2: this difference cannot be told from noise" in quality
    told = {**differing, "quality": {"rougeLsum": {"vs_baseline": {"difference": 0.1, "p_value": 0.01}}}, "n": 40}
    assert "told from noise (p = 0.01, n = 40)" in what_it_tells(told)[-1]


def test_both_sides_arguments_are_checked_before_anything_runs(tmp_path, capsys, monkeypatch):
    """decodebench's command-line entry point in this process: a check that came after the first round would start
    an lm_eval run (and make the output folder) before failing."""
    from decodebench.commands.cli import main

    monkeypatch.chdir(tmp_path)
    method = ("--model-args", "pretrained=embedded,strength=nan")
    code = main(["compare", "--model", "lz", *method, "--tasks", "squad_mini", "--out", str(tmp_path / "compare")])
    err = capsys.readouterr().err
    assert code == 2 and "the method's --model_args: strength=nan: must be a finite number" in err, err
    assert not (tmp_path / "compare").exists(), "nothing may run before both sides are checked"
    code = main(["compare", "--model", "lz", "--baseline-args", "pretrained=embedded,windw=3", "--tasks", "squad_mini"])
    err = capsys.readouterr().err
    assert code == 2 and "the baseline's --model_args: Unknown model argument" in err, err
    assert not (tmp_path / "results").exists()


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
    proc = decodebench_in_process(
        *("compare", "--model", "lz", "--model-args", f"pretrained={tiny_checkpoint}", "--tasks", "squad_mini"),
        *("--limit", "2", "--rounds", "2", "--gen-kwargs", "max_gen_toks=6", "--out", str(out)),
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
        (["--concurrency", "4,inf"], "comma-separated whole numbers >= 1"),  # int(inf) raised OverflowError
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--request-rates", "0,1"], "--request-rates '0,1': comma-separated numbers > 0 (requests/s)"),
        (["--request-rates", "synchronous,fast"], "and 'synchronous' (one request at a time) or 'throughput'"),
        (["--request-rates", "throughput,throughput"], "or 'throughput' (all at once) once each"),
        (["--request-rates", "2e6"], "at most 1e+06 requests/s; 'throughput' sends all"),
        (["--concurrency", "synchronous"], "--concurrency 'synchronous': comma-separated whole numbers >= 1"),
        (["--request-rates", "1", "--concurrency", "4"], "give --concurrency (closed loop) or --request-rates"),
        (["--burstiness", "0.5"], "--burstiness shapes an open loop's arrivals: give --request-rates with it"),
        (["--request-rates", "1", "--slo", "itl:50"], "--slo: slo='itl:50': unknown objective 'itl'"),
        (["--request-rates", "1", "--attainment", "1.5"], "--attainment 1.5: a share in (0, 1]"),
    ],
)
def test_a_sweep_with_a_bad_load_says_what_is_allowed_before_running(flags, message, tmp_path, capsys, monkeypatch):
    """decodebench's command-line entry point in this process (a new Python costs ~5 s a case): nothing listens at
    the base_url, so a check that came after the first run would fail there instead of naming the load."""
    from decodebench.commands.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main(["sweep", "--model", "lz", "--base-url", "http://127.0.0.1:9/v1", "--tasks", "squad_mini", *flags])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "results").exists()


def test_a_rate_sweep_names_the_highest_rate_each_side_kept_its_objectives():
    """From per-level summaries as decodebench sweep builds them: attainment pooled over rounds (Wilson interval),
    and the highest rate with at least the asked attainment, per side."""
    from decodebench.commands.sweep import highest_rate_kept, markdown, pooled_slo

    objectives = {"ttft_s": 0.5}

    def side(met, n):
        return {"objectives_s": objectives, "met": met, "n": n, "goodput_rps": met / 10}

    def level(rate, baseline, method):
        slo = {"baseline": pooled_slo([side(*baseline)]), "method": pooled_slo([side(*method), side(*method)])}
        row = {
            "load": {"kind": "rate", "value": rate},
            "throughput": {"baseline": 10.0, "method": 12.0},
            "throughput_ratio": 1.2,
            "throughput_ratio_interval": None,
            "rounds": 1,
            "latency": {s: {"ttft_s": None, "tpot_s": None} for s in ("baseline", "method")},
            "quality": {},
            "slo": slo,
        }
        return {"squad_mini": row}

    summary = {
        "1 req/s": level(1, (20, 20), (19, 20)),
        "2 req/s": level(2, (19, 20), (15, 20)),
        "4 req/s": level(4, (10, 20), (4, 20)),
    }
    assert summary["1 req/s"]["squad_mini"]["slo"]["method"]["n"] == 40  # two rounds pooled
    kept = highest_rate_kept(summary, 0.9)["squad_mini"]
    assert kept["baseline"]["rate"] == 2 and kept["baseline"]["attainment"] == 0.95
    assert kept["method"]["rate"] == 1 and kept["method"]["met"] == 38
    low, high = kept["method"]["attainment_interval"]
    assert low < 0.95 < high
    text = markdown(summary, "mtad", 1, 0.9)
    assert (
        "- squad_mini, baseline: 2 req/s (95% of 20 [" in text and "- squad_mini, method: 1 req/s (95% of 40 [" in text
    )
    strict = highest_rate_kept(summary, 0.99)["squad_mini"]
    assert strict["baseline"]["rate"] == 1 and "method" not in strict  # the method met 99% at no rate swept
    assert "- squad_mini, method: none of the loads swept" in markdown(summary, "mtad", 1, 0.99)


def test_a_rate_sweep_runs_from_synchronous_to_throughput_and_names_the_heaviest_load_kept():
    """GuideLLM's ends by name: synchronous is a closed loop of one request (no arrival shape), throughput the open
    loop's highest rate (every request at once); they sort around the rates, keep their names through the output
    folders, and the heaviest load kept may be either, reported with the requests/s it answered."""
    from decodebench.commands.sweep import Level, highest_rate_kept, markdown, parse_levels, pooled_slo
    from decodebench.models.backends.served_load import MAX_REQUEST_RATE

    levels = parse_levels(None, "throughput,2,synchronous,0.5", "0.5", "ttft:500")
    assert [level.name for level in levels] == ["synchronous", "0.5 req/s", "2 req/s", "throughput"]
    synchronous, throughput = levels[0], levels[-1]
    assert synchronous.args() == {"num_concurrent": "1", "slo": "ttft:500"}  # burstiness shapes open loops only
    assert throughput.args() == {"request_rate": f"{MAX_REQUEST_RATE:g}", "burstiness": "0.5", "slo": "ttft:500"}
    assert [Level.from_folder(level.folder).order for level in levels] == [level.order for level in levels]

    def row(kind, value, met):
        slo = {s: pooled_slo([{"objectives_s": {"ttft_s": 0.5}, "met": met, "n": 10, "goodput_rps": 1.0}])
               for s in ("baseline", "method")}  # fmt: skip
        return {
            "squad_mini": {
                "load": {"kind": kind, "value": value},
                "requests_per_s": {"baseline": 0.8, "method": 6.5 if kind == "throughput" else 0.9},
                "throughput": {"baseline": 10.0, "method": 10.0},
                "throughput_ratio": 1.0,
                "throughput_ratio_interval": None,
                "latency": {s: {"ttft_s": None, "tpot_s": None} for s in ("baseline", "method")},
                "quality": {},
                "slo": slo,
            }
        }

    summary = {"synchronous": row("synchronous", None, 10), "1 req/s": row("rate", 1, 7)}
    kept = highest_rate_kept(summary, 0.9)["squad_mini"]["method"]
    assert (kept["level"], kept["rate"], kept["requests_per_s"]) == ("synchronous", None, 0.9)  # 1 req/s kept 70%
    summary["throughput"] = row("throughput", None, 10)
    kept = highest_rate_kept(summary, 0.9)["squad_mini"]["method"]
    assert kept["level"] == "throughput"
    assert "- squad_mini, method: throughput (6.50 req/s answered) (100% of 10 [" in markdown(summary, "mtad", 1)
