"""The real `lm_eval` command with our baseline: results, samples, parity with HFLM, bad input."""

from __future__ import annotations

import json

import pytest
from conftest import (
    console_script,
    decodebench_in_process,
    explain,
    lm_eval_in_process,
    read_results,
    read_samples,
    results_files,
    run_lm_eval,
)

pytestmark = [pytest.mark.model, pytest.mark.slow]

LIMIT = "6"
# Short answers keep the runs short; the task is a real sample (squad_mini).
SHORT = ("--gen_kwargs", "max_gen_toks=12")


@pytest.fixture(scope="module")
def baseline_run(embedded_checkpoint, tmp_path_factory):
    # Run from an unrelated folder: bundled task data must resolve wherever lm_eval runs.
    cwd = tmp_path_factory.mktemp("elsewhere")
    out = cwd / "out"
    proc = run_lm_eval(
        "--model",
        "baseline",
        "--tasks",
        "squad_mini",
        "--limit",
        LIMIT,
        *SHORT,
        "--output_path",
        str(out),
        "--log_samples",
        cwd=cwd,
    )
    assert proc.returncode == 0, explain(proc)
    return out, proc


def test_results_carry_quality_speed_and_energy_per_task(baseline_run):
    out, _ = baseline_run
    results = read_results(out)
    assert set(results["results"]["squad_mini"]) >= {"normalized_accuracy,none", "exact_match,none", "f1,none"}
    info = results["config"]["decodebench"]
    assert info["method"] == "baseline" and info["backend"] == "hf" and info["embedded_model"] is True
    stats = info["tasks"]["squad_mini"]
    assert stats["requests"] == int(LIMIT)
    assert stats["new_tokens"] > 0 and stats["tokens_per_second"] > 0 and stats["generate_seconds"] > 0
    assert sum(stats["finish_reasons"].values()) == int(LIMIT)
    if info["energy"]["available"]:
        assert stats["joules_per_token"] > 0
    else:  # never an estimate: unavailable, with the reason
        assert stats["joules_per_token"] is None and stats["energy_unavailable_reason"]
    assert info["machine"]["cpu_count"] >= 1 and info["machine"]["versions"]["lm-eval"] == "0.4.13"


def test_samples_carry_per_request_measurements(baseline_run, embedded_checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_checkpoint)
    out, _ = baseline_run
    samples = read_samples(out, "squad_mini")
    assert len(samples) == int(LIMIT)
    for sample in samples:
        (record,) = sample["decodebench"]
        prompt = sample["arguments"]["gen_args_0"]["arg_0"]
        assert record["prompt_tokens"] == len(tokenizer(prompt).input_ids)
        response = sample["resps"][0][0]
        assert record["new_tokens"] >= len(tokenizer(response, add_special_tokens=False).input_ids)
        assert record["finish_reason"] in {"eos", "stop", "length"}
        assert record["latency_s"] > 0 and record["tokens_per_second"] > 0


def test_plain_hf_model_still_works_and_matches_the_baseline(baseline_run, embedded_checkpoint, tmp_path):
    out_hf = tmp_path / "hf"
    lm_eval_in_process(
        "--model",
        "hf",
        "--model_args",
        f"pretrained={embedded_checkpoint}",
        "--tasks",
        "squad_mini",
        "--limit",
        LIMIT,
        *SHORT,
        "--output_path",
        str(out_hf),
        "--log_samples",
        cwd=tmp_path,
    )
    ours = {s["doc_id"]: s["resps"] for s in read_samples(baseline_run[0], "squad_mini")}
    theirs = {s["doc_id"]: s["resps"] for s in read_samples(out_hf, "squad_mini")}
    assert ours == theirs, "the measured baseline must generate exactly what lm-eval's HFLM does"


def test_unknown_model_argument_fails_clearly_and_writes_no_results(tmp_path):
    out = tmp_path / "out"
    proc = run_lm_eval(
        "--model",
        "baseline",
        "--model_args",
        "pretrained=embedded,windw=3",
        "--tasks",
        "squad_mini",
        "--limit",
        "1",
        "--output_path",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "Unknown model argument(s) for --model baseline with backend=hf: windw" in proc.stderr
    assert "hf arguments:" in proc.stderr and "max_length" in proc.stderr
    assert results_files(out) == []


def test_main_job_runs_lm_eval_and_says_where_results_are(tiny_checkpoint, tmp_path, monkeypatch):
    from decodebench.commands import runs

    monkeypatch.setattr(runs, "described_environment", lambda: "described by the process that started the runs")
    out = tmp_path / "results"
    # CI runs the whole main job on the embedded model through README line 1; here the baseline and the compared
    # method on one task, on the tiny model (its six runs' decoding is not what this test checks)
    command = ["demo", "--out", str(out), "--limit", "1", "--methods", "baseline,mtad", "--tasks", "squad_mini"]
    command += ["--compared-limit", "1", "--pretrained", str(tiny_checkpoint)]
    proc = decodebench_in_process(*command, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    (results,) = results_files(out / "baseline")
    assert str(results) in proc.stdout
    # the machine and packages described once, by the process that forked the runs (collect_env's pip list a run)
    assert json.loads(results.read_text())["pretty_env_info"] == "described by the process that started the runs"
    assert "| squad_mini: normalized_accuracy | baseline |" in proc.stdout
    assert "x baseline" not in proc.stdout  # no speed ratio between runs taken one after another
    assert (out / "leaderboard" / "leaderboard.html").is_file()
    assert f"leaderboard: {out / 'leaderboard' / 'leaderboard.html'}" in proc.stdout
    # lm-eval's own output is in the run's log, not on the terminal, which shows a progress bar per run
    log = (out / "baseline" / "lm_eval.log").read_text()
    assert "--apply_chat_template was not given" not in log  # the main job applies it
    assert log.startswith("$ lm_eval --model baseline") and "Running generate_until requests" in log
    assert "Task 'aime' from" in log and "overrides existing task" in log  # from the index the fork server built
    assert "Running generate_until requests" not in proc.stdout + proc.stderr and "[1/6] baseline: 100%" in proc.stderr
    # an untimed run first, whose results enter nothing
    assert proc.stderr.index("[warm-up] baseline (untimed, discarded): 100%") < proc.stderr.index("[1/6] baseline")
    assert len(results_files(out / "warm-up")) == 1 and str(out / "warm-up") not in proc.stdout
    # the interleaved comparison, after every run: round 1 runs the baseline first, round 2 the compared method
    assert proc.stderr.index("[2/6] mtad: 100%") < proc.stderr.index("[3/6] baseline, round 1 on squad_mini")
    assert proc.stderr.index("[3/6] baseline, round 1") < proc.stderr.index("[4/6] mtad, round 1 on squad_mini")
    assert proc.stderr.index("[5/6] mtad, round 2 on squad_mini") < proc.stderr.index("[6/6] baseline, round 2")
    assert "Interleaved: round 1 ran the baseline, then the method" in proc.stdout
    assert "| squad_mini | 1 |" in proc.stdout and "| 1 of 1 | normalized_accuracy |" in proc.stdout  # greedy MTAD
    assert "Its generations are the baseline's on 1 of 1 documents" in proc.stdout
    compared = json.loads((out / "interleaved" / "compare.json").read_text())["squad_mini"]
    assert len(compared["round_speed_ratios"]) == 2 and compared["speed_ratio_documents"] == 1
    # as wide as the main job's on the embedded model, whose results lm-eval files under "embedded"
    assert max(len(line.replace(results.parent.name, "embedded")) for line in proc.stdout.splitlines()) <= 160


def test_a_main_job_on_a_checkpoint_folder_that_is_not_there_stops_before_any_run(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    proc = decodebench_in_process("demo", "--out", str(tmp_path / "out"), "--pretrained", str(missing), cwd=tmp_path)
    assert proc.returncode == 2 and f"--pretrained {missing}: no such checkpoint folder" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_chat_model_run_without_its_template_is_warned_about_before_generation(baseline_run):
    _, proc = baseline_run  # run without --apply_chat_template
    warning = "has a chat template, but --apply_chat_template was not given"
    assert warning in proc.stderr
    assert proc.stderr.index(warning) < proc.stderr.index("generate_until"), "the warning comes before generation"


def test_ctrl_c_in_the_main_job_reports_the_runs_that_finished(embedded_checkpoint, tmp_path):
    import os
    import signal
    import subprocess

    from conftest import Lines, offline_env

    out = tmp_path / "results"
    command = [console_script("decodebench"), "demo", "--out", str(out), "--limit", "1", "--tasks", "squad_mini"]
    command.append("--no-warm-up")
    proc = subprocess.Popen(
        [*command, "--methods", "baseline,lz"],
        cwd=tmp_path,
        env=offline_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C reaches it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as a script's `cmd &` starts it
    )
    # lz's progress bar gets its total once lm-eval starts generating: lz's run is then decoding its 16 tokens
    # (seconds, more on a loaded machine) and the interrupt lands inside it, not after it
    stderr_lines = Lines(proc.stderr)
    generating = stderr_lines.wait_for("[2/2] lz:   0%")
    os.killpg(proc.pid, signal.SIGINT)
    stdout = proc.stdout.read()
    proc.wait(timeout=300)
    stderr = stderr_lines.text()
    assert generating, stdout[-2000:] + stderr[-3000:]
    assert proc.returncode == 130, stdout[-2000:] + stderr[-3000:]
    assert "interrupted: 1 of 2 runs finished" in stdout and "Traceback" not in stdout
    assert (
        out / "leaderboard" / "leaderboard.md"
    ).is_file() and "| squad_mini: normalized_accuracy | baseline |" in stdout
    assert "Running generate_until requests" in (out / "lz" / "lm_eval.log").read_text()  # lm-eval's own output


def test_results_of_the_embedded_model_land_under_a_readable_name(baseline_run):
    out, _ = baseline_run
    (results,) = results_files(out)
    assert results.parent.name == "embedded"  # not lm-eval's random id for a run without pretrained=


def test_a_run_resumed_with_use_cache_completes_and_counts_cached_requests_apart(tiny_checkpoint, tmp_path):
    cache = tmp_path / "cache" / "lm"
    common = ("--model", "baseline", "--model_args", f"pretrained={tiny_checkpoint}", "--tasks", "squad_mini")
    common += (*SHORT, "--use_cache", str(cache), "--log_samples")
    lm_eval_in_process(*common, "--limit", "2", "--output_path", str(tmp_path / "first"), cwd=tmp_path)
    # the same run again, now asked for more documents: what was generated comes from the cache
    lm_eval_in_process(*common, "--limit", "3", "--output_path", str(tmp_path / "second"), cwd=tmp_path)
    stats = read_results(tmp_path / "second")["config"]["decodebench"]["tasks"]["squad_mini"]
    assert stats["requests"] == 1 and stats["cached_requests"] == 2  # only one request was generated and timed
    samples = read_samples(tmp_path / "second", "squad_mini")
    assert len(samples) == 3 and sum("decodebench" in sample for sample in samples) == 1
    # another method on the same cache would be answered with the baseline's text: refused before any answer
    lz = ("--model", "lz", "--model_args", f"pretrained={tiny_checkpoint}", *common[4:])
    third = run_lm_eval(*lz, "--limit", "3", "--output_path", str(tmp_path / "third"), cwd=tmp_path)
    assert third.returncode != 0 and f"--use_cache {cache}_rank0.db holds the answers of" in third.stderr
    assert '"method": "baseline"' in third.stderr and '"method": "lz"' in third.stderr
    assert results_files(tmp_path / "third") == []
