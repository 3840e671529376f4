"""SQuAD metrics against the official v1.1 semantics and the nugget paper's appendix E."""

from __future__ import annotations

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
