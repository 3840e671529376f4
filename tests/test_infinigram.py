"""infini-gram agreement against a brute-force count, and bad indexes refused clearly."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from decodebench.metrics import infinigram_agreement
from decodebench.metrics.infinigram_index import Index, InfinigramIndexError, build_index, check_index

pytestmark = pytest.mark.model  # needs the embedded model's tokenizer

SEPARATOR = 2**16 - 1


@pytest.fixture(scope="module")
def tokenizer(embedded_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_checkpoint)


@pytest.fixture(scope="module")
def small_index(tokenizer, tmp_path_factory):
    """~60k tokens over a 40-token vocabulary, so that long matches are common."""
    rng = np.random.default_rng(0)
    probs = 1 / np.arange(1, 41)
    docs = [rng.choice(40, size=rng.integers(50, 400), p=probs / probs.sum()).tolist() for _ in range(260)]
    motif = [7, 3, 9, 1, 12, 5]
    docs += [motif * 4 + doc[:20] for doc in docs[:30]]  # shared n-grams across documents
    path = tmp_path_factory.mktemp("index") / "small"
    build_index(docs, path, tokenizer, "embedded", log=lambda msg: None)
    data = np.concatenate([np.array([SEPARATOR, *doc], dtype=np.int64) for doc in docs])
    return Index(path, tokenizer), data


def brute_force(data: np.ndarray, prompt: list[int], token: int) -> tuple[float, int]:
    """Section 2 of the paper: back off to the longest prompt suffix that occurs in the data."""
    for k in range(len(prompt), -1, -1):
        if k == 0:
            return float((data == token).sum() / len(data)), 0
        windows = np.lib.stride_tricks.sliding_window_view(data, k)
        starts = np.nonzero((windows == np.array(prompt[-k:])).all(axis=1))[0]
        if len(starts):
            following = starts[starts + k < len(data)] + k
            return float((data[following] == token).sum() / len(starts)), k
    raise AssertionError("unreachable")


def test_engine_probabilities_equal_brute_force(small_index):
    index, data = small_index
    rng = np.random.default_rng(1)
    for _ in range(60):
        prompt = rng.integers(0, 40, size=rng.integers(0, 9)).tolist()
        if rng.random() < 0.3:
            prompt = [7, 3, 9, 1, 12][: rng.integers(1, 6)]
        token = int(rng.integers(0, 40))
        prob, suffix = index.infgram_prob(prompt, token)
        expected_prob, expected_suffix = brute_force(data, prompt, token)
        assert suffix == expected_suffix, (prompt, token)
        assert prob == pytest.approx(expected_prob), (prompt, token)


def test_agreement_equals_a_brute_force_count_with_full_prefixes(small_index):
    index, data = small_index
    rng = np.random.default_rng(2)
    continuation = ([7, 3, 9, 1, 12, 5] * 3 + rng.integers(0, 40, size=40).tolist())[:50]
    context = [4, 4, 2]
    result = infinigram_agreement(continuation, index, context=context)
    sequence = context + continuation
    agreeing, by_n = 0, {}
    for i in range(len(context), len(sequence)):
        prob, suffix = brute_force(data, sequence[:i], sequence[i])
        by_n.setdefault(suffix + 1, [0, 0])
        by_n[suffix + 1][0] += 1
        by_n[suffix + 1][1] += prob > 0.5
        agreeing += prob > 0.5
    assert result.tokens == len(continuation) and result.agreeing == agreeing
    assert result.by_effective_n == by_n
    assert result.agreement == pytest.approx(agreeing / len(continuation))


def test_scoring_in_parallel_chunks_changes_nothing(small_index, monkeypatch):
    import decodebench.metrics.infinigram as module

    index, _ = small_index
    rng = np.random.default_rng(3)
    continuation = ([7, 3, 9, 1, 12, 5] * 6 + rng.integers(0, 40, size=200).tolist()) * 2
    whole = infinigram_agreement(continuation, index, context=[4, 4, 2])
    monkeypatch.setattr(module, "CHUNK", 7)
    chunked = infinigram_agreement(continuation, index, context=[4, 4, 2])
    assert (chunked.tokens, chunked.agreeing, chunked.by_effective_n) == (
        whole.tokens,
        whole.agreeing,
        whole.by_effective_n,
    )


def test_text_is_tokenized_with_the_index_tokenizer(small_index, tokenizer):
    index, _ = small_index
    text = "The penalty looks back over a window of recent tokens."
    assert infinigram_agreement(text, index).tokens == len(tokenizer(text, add_special_tokens=False).input_ids)


def test_missing_corrupt_small_and_foreign_indexes_are_refused(small_index, tokenizer, tmp_path):
    index, _ = small_index
    with pytest.raises(InfinigramIndexError, match="does not exist"):
        check_index(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    shutil.copytree(index.info.path, broken)
    (broken / "table.0").write_bytes((broken / "table.0").read_bytes()[:-3])
    with pytest.raises(InfinigramIndexError, match="corrupt"):
        check_index(broken)
    (broken / "table.0").unlink()
    with pytest.raises(InfinigramIndexError, match=r"table\.0 is missing"):
        check_index(broken)
    foreign = tmp_path / "foreign"
    shutil.copytree(index.info.path, foreign)
    meta = json.loads((foreign / "decodebench-index.json").read_text())
    (foreign / "decodebench-index.json").write_text(json.dumps({**meta, "tokenizer_fingerprint": "0" * 16}))
    with pytest.raises(InfinigramIndexError, match="built with another tokenizer"):
        Index(foreign, tokenizer)
    with pytest.raises(InfinigramIndexError, match="too small to index"):
        build_index(["a tiny corpus"], tmp_path / "tiny", tokenizer, "embedded", log=lambda msg: None)
    assert not (tmp_path / "tiny").exists()
