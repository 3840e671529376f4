"""Degenerate repetition: back-to-back loops found exactly, normal text left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodebench.metrics import degenerate_repetition, find_degenerate_repetition
from decodebench.metrics.loops import Loop, detect, find_loops

QWQ = (  # the excerpt of the LZ penalty paper (section 1): runs of ~18, drifting
    "Non! " * 19 + "nono! " + "This! " * 19 + "Third! " * 18 + "Tenth! " * 18 + "tenth! " * 17 + "Okay! " + "We! " * 18
)
NORMAL_TEXT = Path(__file__).with_name("data") / "normal_text.txt"


def test_a_unit_repeated_20_times_is_degenerate_with_its_unit_and_count():
    text = "Let me think. " + "I should check the sum again. " * 23 + "Done"
    found = find_degenerate_repetition(text)
    assert found.degenerate and found.kind == "loop" and found.count == 23
    assert found.unit.strip(" .") in {"I should check the sum again", "should check the sum again. I"} or (
        "check the sum again" in found.unit
    )
    assert len(found.unit) == len("I should check the sum again. ")


def test_nineteen_copies_are_not_degenerate():
    assert not degenerate_repetition("Start. " + "Yes! " * 19 + "End.")
    assert degenerate_repetition("Start. " + "Yes! " * 20 + "End.")


def test_the_papers_drifting_loop_is_caught_as_a_drift_not_a_strict_loop():
    assert not find_degenerate_repetition(QWQ, drift=False).degenerate  # no run reaches 20
    found = find_degenerate_repetition(QWQ)
    assert found.degenerate and found.kind == "drift" and found.count >= 100 and found.unit == "Non! "


def test_long_normal_text_with_recurring_words_is_not_degenerate():
    text = NORMAL_TEXT.read_text()
    assert text.count(" the ") > 40
    assert not degenerate_repetition(text)


def test_a_periodic_unit_is_reported_at_its_smallest_period():
    found = find_degenerate_repetition("ab " * 40)
    assert found.count == 40 and found.unit in {"ab ", " ab"}
    assert find_loops(np.array([1, 2] * 30), min_count=20) == [Loop(0, 2, 30)]


def test_empty_and_short_inputs():
    assert not degenerate_repetition("")
    assert not degenerate_repetition("ok")
    assert find_loops(np.array([], dtype=np.int64)) == []
    with pytest.raises(ValueError):
        find_loops(np.array([1, 2, 3]), min_count=1)


def naive_max_copies(seq: list[int], period: int) -> int:
    best = 0
    for start in range(len(seq)):
        copies = 1
        while start + (copies + 1) * period <= len(seq) and (
            seq[start + copies * period : start + (copies + 1) * period] == seq[start : start + period]
        ):
            copies += 1
        best = max(best, copies)
    return best


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.lists(st.integers(0, 3), max_size=30),
    unit=st.lists(st.integers(0, 3), min_size=1, max_size=6),
    copies=st.integers(0, 9),
    suffix=st.lists(st.integers(0, 3), max_size=30),
    min_count=st.integers(2, 6),
)
def test_loops_agree_with_a_brute_force_count(prefix, unit, copies, suffix, min_count):
    seq = prefix + unit * copies + suffix
    loops = find_loops(np.array(seq, dtype=np.int64), min_count=min_count)
    for loop in loops:  # every reported loop is real and maximal
        body = seq[loop.start : loop.end]
        assert body == seq[loop.start : loop.start + loop.period] * loop.count
        assert loop.count >= min_count
        assert not (loop.start >= loop.period and seq[loop.start - loop.period : loop.start] == body[: loop.period])
    for period in range(1, len(seq) // min_count + 1):  # every loop that exists is found
        if naive_max_copies(seq, period) >= min_count:
            assert any(period % loop.period == 0 for loop in loops), (seq, period)
    assert (detect(np.array(seq, dtype=np.int64), min_count=min_count, drift=False) is not None) == bool(loops)


def test_a_template_that_only_counts_up_is_a_loop():
    lines = "".join(f"{n}. Now, multiply 1 by {n - 5} to get {n - 4}.\n" for n in range(6, 40))
    found = find_degenerate_repetition("1. First, convert the numbers.\n" + lines)
    assert found.degenerate and found.count >= 30
    assert not degenerate_repetition("1. Buy milk.\n2. Walk the dog.\n3. Call Anna.\n4. Pay the rent.\n")
