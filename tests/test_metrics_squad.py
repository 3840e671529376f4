"""SQuAD metrics against the official v1.1 semantics and the nugget paper's appendix E."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodebench.metrics import (
    normalize_answer,
    nugget_normalize,
    squad_exact_match,
    squad_f1,
    squad_normalized_accuracy,
)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The Cat!", "cat"),
        ("  a  dog, an APPLE  ", "dog apple"),
        ("theater", "theater"),  # articles only as whole words
        ("Denver Broncos.", "denver broncos"),
        ("U.S.A", "usa"),  # punctuation is removed, not replaced by spaces
    ],
)
def test_official_normalization(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_and_f1_take_the_best_gold_answer():
    golds = ["Denver Broncos", "The Broncos"]
    assert squad_exact_match("the broncos", golds) == 1.0
    assert squad_exact_match("Broncos of Denver", golds) == 0.0
    # official F1: "broncos of denver" vs "denver broncos": overlap 2, P 2/3, R 1
    assert squad_f1("Broncos of Denver", golds) == pytest.approx(0.8)
    assert squad_f1("Carolina Panthers", golds) == 0.0
    assert squad_f1("", golds) == 0.0


def test_nugget_normalization_follows_appendix_e():
    # numbers to digits, punctuation to spaces, stripped, lower-cased; articles are kept
    assert nugget_normalize("  Two-thirds of THE U.S.  ") == "2 thirds of the u s"
    assert nugget_normalize("twenty-one, Twenty one and ninety") == "21 21 and 90"
    assert nugget_normalize("someone") == "someone"  # "one" only as a whole word


def test_normalized_accuracy_credits_answers_inside_longer_outputs():
    assert squad_normalized_accuracy("The answer is two teams.", ["2 teams"]) == 1.0
    assert squad_normalized_accuracy("It was the Denver Broncos!", ["Denver Broncos"]) == 1.0
    assert squad_normalized_accuracy("Carolina", ["Denver Broncos", "Broncos"]) == 0.0
    assert squad_normalized_accuracy("anything", [""]) == 0.0  # an empty gold answer never matches
    assert squad_normalized_accuracy("", ["Paris"]) == 0.0


def test_normalized_accuracy_matches_whole_words_on_real_squad_answers():
    # SQuAD v1.1 dev 56beace93aeaaa14008c91e2: Super Bowl 50 in Roman numerals, gold "L" (and "Super Bowl L")
    assert squad_normalized_accuracy("Roger Goodell", ["L"]) == 0.0
    assert squad_normalized_accuracy("It would have been called Super Bowl L.", ["Super Bowl L", "L"]) == 1.0
    # 56beae423aeaaa14008c91f6: Cam Newton's turnovers, gold "three"
    assert squad_normalized_accuracy("1,300,000", ["three"]) == 0.0
    assert squad_normalized_accuracy("He had 3 turnovers.", ["three"]) == 1.0
    # 56d6fea90d65d214001982b2: Aqib Talib's interceptions, gold "three." among others
    assert squad_normalized_accuracy("Three.", ["three.", "three"]) == 1.0
    assert squad_normalized_accuracy("thirteen", ["three"]) == 0.0


PACK = Path(__file__).resolve().parents[2] / "shared" / "data" / "official" / "squad_v11_official.jsonl"


def test_exact_match_and_f1_agree_with_the_official_script_on_every_fixture_prediction():
    if not PACK.is_file():
        pytest.skip(f"the official verdicts are not at {PACK}")
    rows = [json.loads(line) for line in PACK.read_text().splitlines()]
    wrong = [
        r
        for r in rows
        if squad_exact_match(r["prediction"], r["answers"]) != r["official_exact_match"]
        or abs(squad_f1(r["prediction"], r["answers"]) - r["official_f1"]) > 1e-9
    ]
    assert len(rows) == 24000 and wrong == [], wrong[:5]
