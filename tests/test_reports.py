"""Leaderboards from lm-eval outputs: reading, tables against known numbers, bad input, a real browser."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from decodebench.reports.leaderboard import write_report
from decodebench.reports.plots import pareto_front
from decodebench.reports.reader import read_runs

MACHINE = {"cpu": "Test CPU", "cpu_count": 2, "usable_cpus": 2, "gpus": [], "versions": {}}


def results_file(
    folder: Path, method: str, tasks: dict, *, measured=True, args=None, pretrained="/m/tiny", backend="hf", energy=None
) -> Path:
    """A results JSON in lm-eval 0.4.13's schema, as decodebench's models write it."""
    results, stats = {}, {}
    for task, (quality, tokens, seconds) in tasks.items():
        results[task] = {"alias": task, "normalized_accuracy,none": quality, "normalized_accuracy_stderr,none": 0.1}
        stats[task] = {
            "requests": 4,
            "new_tokens": tokens,
            "generate_seconds": seconds,
            "tokens_per_second": tokens / seconds,
            "joules_per_token": energy,
            "energy_unavailable_reason": None if energy else "no counter on this test machine",
            "degenerate_rate": 0.25,
            "method": {"block_efficiency": 2.5} if method == "mtad" else {},
            "method_columns": {"block efficiency": 2.5} if method == "mtad" else {},
        }
    config = {"model": method, "model_args": {"pretrained": pretrained}}
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
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"results_{method}.json"
    path.write_text(
        json.dumps(
            {
                "results": results,
                "config": config,
                "git_hash": "abc1234",
                "higher_is_better": {t: {"normalized_accuracy": True} for t in tasks},
                "n-samples": {t: {"effective": 4} for t in tasks},
            }
        )
    )
    return path


@pytest.fixture
def outputs(tmp_path):
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": (0.50, 100, 10.0), "cnndm_mini": (0.2, 50, 5.0)})
    results_file(tmp_path / "mtad", "mtad", {"squad_mini": (0.50, 100, 4.0)}, args={"draft": "context"})
    results_file(tmp_path / "lz", "lz", {"squad_mini": (0.75, 100, 20.0)}, args={"penalty": "lz"}, energy=0.5)
    results_file(tmp_path / "plain", "hf", {"squad_mini": (0.25, 0, 1.0)}, measured=False)
    return tmp_path


def test_tables_show_quality_speed_ratio_energy_and_what_is_missing(outputs, tmp_path):
    written, _problems = write_report([outputs], tmp_path / "board")
    assert sorted(p.name for p in written) == [
        "leaderboard.csv",
        "leaderboard.html",
        "leaderboard.json",
        "leaderboard.md",
    ]
    data = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    squad = {row["run"]: row for row in data["tasks"]["squad_mini"]}
    assert squad["baseline"]["speed_ratio_vs_baseline"] == pytest.approx(1.0)
    assert squad["mtad (draft=context)"]["speed_ratio_vs_baseline"] == pytest.approx(2.5)  # 25 vs 10 tokens/s
    assert squad["lz (penalty=lz)"]["speed_ratio_vs_baseline"] == pytest.approx(0.5)
    assert squad["lz (penalty=lz)"]["joules_per_token"] == 0.5
    assert squad["baseline"]["energy_note"] == "no counter on this test machine"
    assert squad["hf"]["tokens_per_second"] is None and squad["hf"]["speed_note"] == "not measured"
    assert next(row["run"] for row in data["tasks"]["squad_mini"]) == "lz (penalty=lz)"  # best quality first
    markdown = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "| mtad (draft=context) | 0.500 | 25.0 | 2.50x |" in markdown
    assert "plain lm-eval run: no speed or energy measurements" in markdown
    assert "block efficiency 2.50" in markdown
    rows = list(csv.DictReader(io.StringIO((tmp_path / "board" / "leaderboard.csv").read_text())))
    assert len(rows) == 5 and {r["task"] for r in rows} == {"squad_mini", "cnndm_mini"}


def test_an_argument_with_a_newline_keeps_its_table_row_on_one_line(tmp_path):
    results_file(tmp_path / "baseline", "baseline", {"squad_mini": (0.5, 10, 1.0)})
    results_file(tmp_path / "nugget", "nugget", {"squad_mini": (0.25, 10, 1.0)}, args={"split": "\n\n"})
    write_report([tmp_path], tmp_path / "board")
    table = (tmp_path / "board" / "leaderboard.md").read_text().split("## squad_mini")[1].strip().split("\n\n")[0]
    assert [line.startswith("| nugget (split=\\n\\n) |") for line in table.splitlines()[2:]] == [False, True]


def test_partial_runs_and_bad_files_are_reported_not_hidden(tmp_path):
    path = results_file(tmp_path / "cut", "baseline", {"squad_mini": (0.5, 10, 1.0)})
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


def test_empty_folders_and_different_models(tmp_path):
    (tmp_path / "empty").mkdir()
    written, problems = write_report([tmp_path / "empty"], tmp_path / "board")
    assert written == [] and "no lm-eval results" in problems[0]
    results_file(tmp_path / "a", "baseline", {"squad_mini": (0.5, 10, 1.0)}, pretrained="/m/one")
    results_file(tmp_path / "b", "lz", {"squad_mini": (0.5, 10, 2.0)}, pretrained="/m/two")
    written, problems = write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "board2")
    assert written and any("2 different models" in p for p in problems)
    data = json.loads((tmp_path / "board2" / "leaderboard.json").read_text())
    lz = next(r for r in data["tasks"]["squad_mini"] if r["method"] == "lz")
    assert lz["speed_ratio_vs_baseline"] is None and "no baseline" in lz["speed_note"]


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
        "--window-size=1300,1000",
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
        speed_header = next(th for th in panel.find_elements(By.TAG_NAME, "th") if th.text.startswith("tokens/s"))
        speed_header.click()  # ascending: slowest first, unmeasured last
        assert runs()[:3] == ["lz (penalty=lz)", "baseline", "mtad (draft=context)"]
        speed_header.click()
        assert runs()[0] == "mtad (draft=context)"
        assert len(panel.find_elements(By.TAG_NAME, "img")) == 2  # quality vs tokens/s and vs J/token
        driver.find_element(By.ID, "tab-2").click()
        assert driver.find_element(By.ID, "panel-2").is_displayed() and not panel.is_displayed()
        driver.find_element(By.ID, "tab-1").click()
        screenshot = tmp_path / "leaderboard.png"
        driver.save_screenshot(str(screenshot))
        assert screenshot.stat().st_size > 10_000
        if os.environ.get("DECODEBENCH_SCREENSHOT_DIR"):  # keep a copy for a person to look at
            shutil.copy(screenshot, Path(os.environ["DECODEBENCH_SCREENSHOT_DIR"]) / "leaderboard.png")
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()
