"""decodebench's metrics as local Hugging Face `evaluate` modules, loaded offline with `evaluate.load(<path>)`: the same
numbers as decodebench's tasks give, checked against the official scorers' verdicts and the papers' definitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodebench.metrics.evaluate_modules import MODULES, module_path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def load(name: str):
    import evaluate

    return evaluate.load(module_path(name))


def test_every_module_loads_offline_and_an_unknown_one_is_named():
    for name in MODULES:
        assert load(name).name == name
    with pytest.raises(ValueError, match="no decodebench evaluate module 'bleu'; known: squad_normalized_accuracy"):
        module_path("bleu")


def test_squad_scores_equal_the_official_scripts_on_its_verdicts_and_the_papers_definition():
    pack = SHARED / "official" / "squad_v11_official.jsonl"
    if not pack.is_file():
        pytest.skip(f"the official verdicts are not at {pack}")
    rows = [json.loads(line) for line in pack.read_text().splitlines()]
    scores = load("squad_normalized_accuracy").compute(
        predictions=[r["prediction"] for r in rows], references=[r["answers"] for r in rows]
    )
    assert len(rows) == 24000
    assert scores["exact_match"] == pytest.approx(sum(r["official_exact_match"] for r in rows) / len(rows), abs=1e-12)
    assert scores["f1"] == pytest.approx(sum(r["official_f1"] for r in rows) / len(rows), abs=1e-12)
    # appendix E: the normalized answer as whole words inside the normalized generation ("L" is not in "Goodell")
    cases = load("squad_normalized_accuracy").compute(
        predictions=["It would have been called Super Bowl L.", "Roger Goodell", "He had 3 turnovers.", "thirteen"],
        references=[["Super Bowl L", "L"], ["L"], ["three"], ["three"]],
    )
    assert cases["normalized_accuracy"] == 0.5


def test_spider_execution_accuracy_equals_the_test_suite_evaluations_verdicts():
    """All 5,812 official verdicts over 400 real dev questions."""
    verdicts = SHARED / "official" / "spider_exec_official.jsonl"
    if not verdicts.is_file():
        pytest.skip(f"the official verdicts are not at {verdicts}")
    rows = [json.loads(line) for line in verdicts.read_text().splitlines()]
    databases = [str(SHARED / "spider" / "database" / r["db_id"] / f"{r['db_id']}.sqlite") for r in rows]
    metric = load("spider_execution_accuracy")
    scores = metric.compute(
        predictions=[r["prediction"] for r in rows], references=[r["gold"] for r in rows], db_paths=databases
    )
    official = sum(r["official_exec_match"] for r in rows) / len(rows)
    assert len(rows) == 5812 and 0 < official < 1 and scores["execution_accuracy"] == pytest.approx(official, abs=1e-12)
    with pytest.raises(ValueError, match="db_paths: 1 databases for 2 predictions; give one each"):
        metric.compute(
            predictions=["SELECT 1", "SELECT 2"], references=["SELECT 1", "SELECT 2"], db_paths=databases[:1]
        )


def test_degenerate_repetition_is_twenty_copies_back_to_back():
    metric = load("degenerate_repetition")
    looping = "Start. " + "Yes! " * 20 + "End."
    almost = "Start. " + "Yes! " * 19 + "End."
    assert metric.compute(predictions=[looping, almost, "The answer is 42."]) == {"degenerate_repetition": 1 / 3}
    assert metric.compute(predictions=[almost], min_copies=19) == {"degenerate_repetition": 1.0}
