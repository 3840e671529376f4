"""The batched LZ kernel against plain references (the paper's propositions; the authors' released
penalizer) and hand-checked cases."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lz_reference import authors_codelengths, codelengths

from decodebench.kernels.lz import CODELENGTHS, PAD, apply_lz_penalty_, check_lz_sizes, lz_codelengths

V = 7
REFERENCES = {"propositions": codelengths, "authors": authors_codelengths}


def left_pad(histories: list[list[int]], device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged histories -> (tokens [N, L] left-padded with the kernel's PAD, lengths [N]): what the kernel takes."""
    width = max((len(h) for h in histories), default=0)
    tokens = torch.full((len(histories), max(width, 1)), PAD, dtype=torch.long)
    for row, history in enumerate(histories):
        if history:
            tokens[row, width - len(history) :] = torch.as_tensor(history, dtype=torch.long)
    lengths = torch.tensor([len(h) for h in histories], dtype=torch.long)
    return tokens.to(device), lengths.to(device)


def kernel(histories, vocab_size=V, window=16, buffer=4, codelength="propositions"):
    tokens, lengths = left_pad(histories)
    return lz_codelengths(tokens, lengths, vocab_size, window, buffer, codelength)


def assert_matches_reference(histories, vocab_size=V, window=16, buffer=4):
    for codelength in CODELENGTHS:
        got = kernel(histories, vocab_size, window, buffer, codelength)
        for row, history in enumerate(histories):
            expected = REFERENCES[codelength](history, vocab_size, window, buffer)
            assert got[row].tolist() == pytest.approx(expected, abs=1e-5), f"{codelength}, row {row}: {history}"


sizes = st.integers(min_value=1, max_value=9).flatmap(
    lambda buffer: st.tuples(st.integers(min_value=buffer + 1, max_value=buffer + 20), st.just(buffer))
)


@settings(max_examples=150, deadline=None)
@given(
    histories=st.lists(st.lists(st.integers(0, V - 1), max_size=40), min_size=1, max_size=5),
    window_buffer=sizes,
)
def test_kernel_equals_reference_on_random_ragged_batches(histories, window_buffer):
    window, buffer = window_buffer
    assert_matches_reference(histories, window=window, buffer=buffer)


@settings(max_examples=60, deadline=None)
@given(
    unit=st.lists(st.integers(0, V - 1), min_size=1, max_size=5),
    copies=st.integers(1, 12),
    tail=st.integers(0, 4),
    window_buffer=sizes,
)
def test_kernel_equals_reference_on_periodic_histories(unit, copies, tail, window_buffer):
    window, buffer = window_buffer
    periodic = (unit * copies + unit[:tail])[: 3 * window]
    assert_matches_reference([periodic, periodic[:-1], [unit[0]] * len(periodic)], window=window, buffer=buffer)


def test_adversarial_edges():
    assert_matches_reference([[], [3], [3, 3], [1, 2, 1, 2, 1], [5] * 40, list(range(V)) * 3], window=8, buffer=3)
    assert_matches_reference([[2, 2, 2]], window=5, buffer=4)  # shorter than the buffer
    assert_matches_reference([[1, 2, 3]], window=2, buffer=1)  # buffer 1: singletons only


def test_the_authors_charge_the_distance_of_the_longest_match_and_nothing_before_a_full_buffer():
    # At alpha 0.15 and V = 49,152, emitting the token that extends a match whose source is 256 back:
    # the authors' penalty is alpha (log2 V - log2 256) = 1.14, the propositions' alpha (log2 V - 0) = 2.34
    vocab, alpha = 49152, 0.15
    # 40 tokens of history, then "7 8", 254 other tokens, and 7 again: emitting 8 repeats "7 8" 256 back
    history = [*range(1000, 1040), 7, 8, *range(100, 354), 7]
    authors = kernel([history], vocab, window=512, buffer=32, codelength="authors")[0, 8]
    propositions = kernel([history], vocab, window=512, buffer=32, codelength="propositions")[0, 8]
    assert alpha * (math.log2(vocab) - authors) == pytest.approx(1.14, abs=0.005)
    assert alpha * (math.log2(vocab) - propositions) == pytest.approx(2.34, abs=0.005)
    # no penalty (every token log2 V) until more than `buffer` tokens were generated
    assert kernel([[1, 1, 1, 1]], V, window=16, buffer=4, codelength="authors")[0].tolist() == pytest.approx(
        [math.log2(V)] * V
    )
    assert kernel([[1, 1, 1, 1, 1]], V, window=16, buffer=4, codelength="authors")[0, 1] == pytest.approx(0.0)


def test_absent_tokens_cost_log2_v():
    costs = kernel([[0, 1, 2]], vocab_size=50)
    assert costs[0, 3:].tolist() == pytest.approx([math.log2(50)] * 47)
    assert kernel([[]], vocab_size=50)[0].tolist() == pytest.approx([math.log2(50)] * 50)


def test_extending_the_current_match_costs_less_than_a_literal_or_a_new_match():
    # history "4 5 6 0 4 5": emitting 6 extends the match "4 5" -> "4 5 6" (lambda 3)
    costs = kernel([[4, 5, 6, 0, 4, 5]], vocab_size=V, window=16, buffer=8)[0]
    assert costs[6] == pytest.approx(math.log2(3 / 2) - 1)
    assert costs[6] < costs[0] < costs[1] == pytest.approx(math.log2(V))  # 0: singleton 3 back; 1: absent


def test_longer_matches_cost_less():
    long_match = kernel([[1, 2, 3, 4, 9, 1, 2, 3]], vocab_size=10, buffer=8)[0][4]  # "1 2 3" -> "1 2 3 4"
    short_match = kernel([[0, 2, 3, 4, 9, 1, 2, 3]], vocab_size=10, buffer=8)[0][4]  # "2 3" -> "2 3 4"
    assert long_match < short_match < 0


def test_nearer_matches_cost_less():
    costs = kernel([[0, 1, 2, 3, 4]], vocab_size=V, window=16, buffer=4)[0]
    # singletons: 3 is 2 tokens back, 0 is 5 tokens back
    assert costs[3] == pytest.approx(1.0) and costs[0] == pytest.approx(math.log2(5))
    assert costs[3] < costs[0]


def test_window_forgets_old_tokens():
    history = [6] + [0, 1] * 10
    assert kernel([history], window=16)[0][6] == pytest.approx(math.log2(V))  # 21 back, window 16
    assert kernel([history], window=21)[0][6] == pytest.approx(math.log2(21))


def test_apply_in_place_equals_dense_penalty_up_to_a_row_constant():
    torch.manual_seed(0)
    histories = [[3, 1, 3, 1, 3], [], [2], [0, 0, 0, 0, 1, 2, 0, 0]]
    tokens, lengths = left_pad(histories)
    logits = torch.randn(4, V)
    alpha = torch.tensor([0.15, 0.15, 0.5, 1.0])
    for codelength in CODELENGTHS:
        dense = logits + alpha[:, None] * lz_codelengths(tokens, lengths, V, 16, 4, codelength)
        applied = apply_lz_penalty_(logits.clone(), tokens, lengths, alpha, 16, 4, codelength)
        shift = dense - applied
        assert torch.allclose(shift, shift[:, :1].expand_as(shift), atol=1e-5)
        assert torch.equal(dense.argmax(1), applied.argmax(1))
        assert torch.allclose(dense.softmax(1), applied.softmax(1), atol=1e-6)


def test_batched_rows_do_not_affect_each_other():
    histories = [[1, 2, 1, 2, 1], [5, 5, 5], [0, 1, 2, 3, 4, 5, 6, 0]]
    for codelength in CODELENGTHS:
        together = kernel(histories, window=6, buffer=3, codelength=codelength)
        for row, history in enumerate(histories):
            assert torch.equal(together[row], kernel([history], window=6, buffer=3, codelength=codelength)[0])


@pytest.mark.parametrize(
    ("window", "buffer", "message"),
    [
        (32, 32, r"window=32: must be larger than buffer=32 and at most 4096"),
        (8, 0, r"buffer=0: must be in \[1, 256\]"),
        (100_000_000, 32, r"window=100000000: must be larger than buffer=32 and at most 4096"),
        (8192, 10_000_000, r"buffer=10000000: must be in \[1, 256\]"),
        (8.0, 2, "window must be an integer"),
        (8, 2.5, "buffer must be an integer"),
        (True, 2, "window must be an integer"),
    ],
)
def test_bad_sizes_fail_clearly(window, buffer, message):
    with pytest.raises(ValueError, match=message):
        check_lz_sizes(window, buffer)


def test_memory_is_not_batch_times_window_times_vocab():
    # 64 rows x 512 window x V=131072 as int32 would be 17 GB; the kernel stays near N x V.
    histories = torch.randint(0, 131072, (64, 544))
    lengths = torch.full((64,), 544)
    costs = lz_codelengths(histories, lengths, 131072, 512, 32, "authors")
    assert costs.shape == (64, 131072)
