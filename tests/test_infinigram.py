"""infini-gram agreement against a brute-force count, and bad indexes refused clearly."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from decodebench.data.infinigram_index import Index, InfinigramIndexError, build_index, check_index
from decodebench.metrics import infinigram_agreement

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


def test_the_evaluate_module_counts_what_brute_force_counts(small_index, tokenizer):
    """decodebench's `evaluate` module (decodebench.metrics.evaluate_modules), given texts and an index folder: the
    share of their tokens whose infinity-gram probability given the text before them exceeds 0.5, token-weighted."""
    import evaluate

    from decodebench.metrics.evaluate_modules import module_path

    index, data = small_index
    texts = [tokenizer.decode([7, 3, 9, 1, 12, 5] * 3), tokenizer.decode([4, 4, 2, 30, 31, 7, 3, 9])]
    agreeing = tokens = 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        tokens += len(ids)
        agreeing += sum(brute_force(data, ids[:i], ids[i])[0] > 0.5 for i in range(len(ids)))
    metric = evaluate.load(module_path("infinigram_agreement"))
    scores = metric.compute(predictions=texts, index=str(index.info.path))
    assert scores["scored_tokens"] == tokens and scores["infinigram_agreement"] == pytest.approx(agreeing / tokens)
    assert 0 < agreeing < tokens


def damaged_copy(index, tmp_path, name):
    copy = tmp_path / name
    shutil.copytree(index.info.path, copy)
    return copy


def test_missing_corrupt_small_and_foreign_indexes_are_refused(small_index, tokenizer, tmp_path):
    index, _ = small_index
    with pytest.raises(InfinigramIndexError, match="does not exist"):
        check_index(tmp_path / "nowhere")
    broken = damaged_copy(index, tmp_path, "broken")
    (broken / "table.0").write_bytes((broken / "table.0").read_bytes()[:-3])
    with pytest.raises(InfinigramIndexError, match=r"damaged: table\.0 has .* bytes, .* when the index was built"):
        check_index(broken)
    (broken / "table.0").unlink()
    with pytest.raises(InfinigramIndexError, match=r"table\.0 missing"):
        check_index(broken)
    foreign = damaged_copy(index, tmp_path, "foreign")
    meta = json.loads((foreign / "decodebench-index.json").read_text())
    (foreign / "decodebench-index.json").write_text(json.dumps({**meta, "tokenizer_fingerprint": "0" * 16}))
    with pytest.raises(InfinigramIndexError, match="built with another tokenizer"):
        Index(foreign, tokenizer)
    with pytest.raises(InfinigramIndexError, match="too small to index"):
        build_index(["a tiny corpus"], tmp_path / "tiny", tokenizer, "embedded", log=lambda msg: None)
    assert not (tmp_path / "tiny").exists()


def test_a_truncated_shard_is_refused_even_without_recorded_sizes(small_index, tmp_path):
    """Half of tokenized.0 left: sizes no longer fit the suffix array (infini-gram would crash later)."""
    index, _ = small_index
    for recorded in (True, False):
        broken = damaged_copy(index, tmp_path, f"half-{recorded}")
        if not recorded:  # an index built elsewhere, with a hand-written metadata file
            meta = json.loads((broken / "decodebench-index.json").read_text())
            del meta["files"]
            (broken / "decodebench-index.json").write_text(json.dumps(meta))
        data = (broken / "tokenized.0").read_bytes()
        (broken / "tokenized.0").write_bytes(data[: len(data) // 2])
        with pytest.raises(InfinigramIndexError, match="damaged"):
            check_index(broken)


@pytest.mark.parametrize("filling", ["random", "zeros", "0xff"])
def test_a_damaged_suffix_array_is_refused_without_recorded_checksums(small_index, tmp_path, filling):
    """table.0 overwritten at its own size, in an index whose metadata records no files (prebuilt indexes, and what
    the README tells their users to write): the engine would segfault on it (rc 139, no message)."""
    index, _ = small_index
    broken = damaged_copy(index, tmp_path, filling)
    meta = json.loads((broken / "decodebench-index.json").read_text())
    del meta["files"]
    (broken / "decodebench-index.json").write_text(json.dumps(meta))
    size = (broken / "table.0").stat().st_size
    content = {
        "random": np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes(),
        "zeros": bytes(size),
        "0xff": b"\xff" * size,
    }[filling]
    (broken / "table.0").write_bytes(content)
    with pytest.raises(InfinigramIndexError, match=r"suffix array of shard 0 \(table.0\)"):
        check_index(broken)


def test_one_suffix_array_entry_outside_the_data_is_refused_wherever_it_is(small_index, tmp_path):
    """One pointer damaged between the entries the order check samples: the engine would follow it out of the data."""
    from decodebench.data.infinigram_index import SUFFIX_ARRAY_SAMPLE

    index, _ = small_index
    broken = damaged_copy(index, tmp_path, "one entry")
    meta = json.loads((broken / "decodebench-index.json").read_text())
    del meta["files"]
    (broken / "decodebench-index.json").write_text(json.dumps(meta))
    data_size = (broken / "tokenized.0").stat().st_size
    pointer_bytes = math.ceil(math.log2(data_size) / 8)
    table = bytearray((broken / "table.0").read_bytes())
    count = len(table) // pointer_bytes
    sampled = set(np.linspace(0, count - 2, SUFFIX_ARRAY_SAMPLE).astype(np.int64).tolist())
    sampled |= {row + 1 for row in sampled} | {0}
    entry = next(row for row in range(count // 2, count) if row not in sampled)
    table[entry * pointer_bytes : (entry + 1) * pointer_bytes] = b"\xff" * pointer_bytes
    (broken / "table.0").write_bytes(bytes(table))
    with pytest.raises(InfinigramIndexError, match=rf"points outside the data or between tokens \(entry {entry}\)"):
        check_index(broken)


def test_foreign_files_beside_valid_metadata_are_refused(small_index, tmp_path):
    """infini-gram's engine reads every file whose name contains `tokenized`, `table`, ... ."""
    index, _ = small_index
    for name in ("tokenized.0.bak", "table.1", "old-offset.0"):
        polluted = damaged_copy(index, tmp_path, name)
        (polluted / name).write_bytes(b"\xff" * 64)
        with pytest.raises(InfinigramIndexError, match=f"holds {name}, which is not one of the index's files"):
            check_index(polluted)
    altered = damaged_copy(index, tmp_path, "altered")
    data = bytearray((altered / "tokenized.0").read_bytes())
    data[-1] ^= 1  # same size, another token: only the recorded checksum tells
    (altered / "tokenized.0").write_bytes(bytes(data))
    with pytest.raises(InfinigramIndexError, match="sha256 differs"):
        check_index(altered)
    info = check_index(index.info.path)
    assert info.checksum and info.checksum_verified and info.describe()["tokens"] == info.tokens


def test_the_reference_index_holds_no_gold_answer_of_a_bundled_sample(embedded_checkpoint):
    """No gold answer of squad_mini, spider_mini, cnndm_mini, aime_mini or gpqa_mini is in the default
    reference index as an n-gram of 8 or more tokens (so none of 8 tokens, the shortest such n-gram)."""
    import importlib.util

    from decodebench.data.paths import TASKS_DIR
    from decodebench.metrics.infinigram import default_index

    def utils(folder):
        spec = importlib.util.spec_from_file_location(f"utils_{folder}", TASKS_DIR / folder / "utils.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    answers = [a for doc in utils("squad").load_mini()["validation"] for a in doc["answers"]["text"]]
    answers += [doc["query"] for doc in utils("spider").load_mini()["validation"]]
    answers += [doc["highlights"] for doc in utils("cnndm").load_mini()["test"]]
    answers += [doc["Answer"] for doc in utils("aime").load_mini()["test"]]
    answers += [doc["choices"]["ABCD".index(doc["answer"])] for doc in utils("gpqa").load_mini()["train"]]
    index = default_index()
    assert "Python" in index.info.corpus
    found = []
    for answer in answers:
        ids = index.encode(answer)
        found += [answer[:80] for start in range(len(ids) - 7) if index.count(ids[start : start + 8])]
    assert len(answers) > 900 and found == [], found[:5]


def test_every_result_records_the_index_that_produced_agreement(small_index, monkeypatch):
    from decodebench.metrics import generation

    index, _ = small_index
    monkeypatch.setenv(generation.INDEX_ENV, str(index.info.path))
    generation.reset_reference()
    try:
        scores = generation.generation_metrics("one two three")
        described = scores["infinigram_reference"]
        assert described["path"] == str(index.info.path) and described["checksum"] == index.info.checksum
        assert described["scored_tokens"] == scores["infinigram_agreement"][1] > 0
        assert generation.reference_of([described]) == described
        # a task whose every generation is empty: its agreement is null, and the reference says why
        empty = generation.generation_metrics("")
        assert empty["infinigram_agreement"][:2] == [0, 0]
        assert generation.agreement([empty["infinigram_agreement"]]) is None
        reason = generation.reference_of([empty["infinigram_reference"]] * 3)
        assert reason["scored_tokens"] == 0 and "no tokens to score" in reason["agreement"]
        monkeypatch.setenv(generation.INDEX_ENV, "none")
        generation.reset_reference()
        off = generation.generation_metrics("one two three")
        assert off["infinigram_agreement"] is None and "switched off" in off["infinigram_reference"]["unavailable"]
    finally:
        generation.reset_reference()
