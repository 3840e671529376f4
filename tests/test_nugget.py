"""Nugget compression: selection and gather kernels, the model logic on a tiny model, bad input."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from decodebench.kernels.nugget import (
    REPEATED_LAST,
    check_ratio,
    content_words,
    delimiter_scores,
    gather_kv,
    nuggets_for,
    position_scores,
    question_overlap_scores,
    salience_scores,
    select_topk,
    span_scores,
    straight_through_bias,
)


def test_topk_keeps_ceil_n_over_ratio_in_text_order_with_the_last_token():
    scores = torch.tensor([[5.0, 1.0, 9.0, 3.0, 8.0, 0.0, 7.0, 2.0, 6.0, 4.0, -1.0], [1.0] * 11])
    lengths = torch.tensor([11, 4])
    indices, mask = select_topk(scores, lengths, ratio=4)
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    assert indices[0].tolist() == [2, 4, 10]  # two best (9, 8), plus the forced last token, sorted
    assert indices[1, :1].tolist() == [3]  # one nugget: the last real token
    assert nuggets_for(11, 4) == 3 and nuggets_for(0, 4) == 0 and nuggets_for(3, 10) == 1


def test_topk_keeps_an_opening_whole_and_applies_the_ratio_to_the_document_alone():
    """The authors compress only the document: a row's first ``w`` tokens are kept whatever they score, and eq. 15's
    ceil(n / r) counts the other n - w."""
    scores = torch.tensor([[0.0, 0.0, 0.0, 5.0, 1.0, 9.0, 3.0, 8.0, 2.0, 4.0], [9.0] * 10])
    indices, mask = select_topk(scores, torch.tensor([10, 10]), ratio=3, kept_whole=torch.tensor([3, 0]))
    assert mask.sum(dim=1).tolist() == [3 + 3, 4]  # ceil(7 / 3) = 3 nuggets beside the opening; ceil(10 / 3) = 4
    assert indices[0].tolist() == [0, 1, 2, 5, 7, 9]  # the opening, the two best (9, 8), the forced last token
    whole, _ = select_topk(torch.zeros(1, 4), torch.tensor([4]), ratio=2, kept_whole=torch.tensor([9]))
    assert whole[0].tolist() == [0, 1, 2, 3]  # an opening longer than the row keeps the row, nothing more


def test_gather_keeps_the_selected_positions_of_every_head():
    keys = torch.arange(2 * 3 * 5 * 2, dtype=torch.float32).reshape(2, 3, 5, 2)
    values = -keys
    indices = torch.tensor([[0, 3], [1, 4]])
    k, v = gather_kv(keys, values, indices)
    assert torch.equal(k[0], keys[0][:, [0, 3]]) and torch.equal(k[1], keys[1][:, [1, 4]])
    assert torch.equal(v, -k)


def test_training_free_scores_prefer_delimiters_then_later_tokens():
    scores = delimiter_scores(["The", " cat", ",", " sat", ".", "\n", " It", " ran"])
    order = torch.argsort(scores, descending=True).tolist()
    assert order[:3] == [5, 4, 2]  # newline, full stop, comma
    streaming = position_scores(10, sinks=2)
    assert torch.topk(streaming, 5).indices.sort().values.tolist() == [0, 1, 7, 8, 9]


def test_salience_keeps_whole_words_names_and_numbers_first_then_the_most_surprising():
    texts = ["The", " river", " Al", "der", " rose", " 3", ".", "5", " m", " on", " Mon", "day", ",", " flood", "ing"]
    surprisal = torch.tensor([0.0, 2.0, 9.0, 1.0, 4.0, 6.0, 0.5, 0.5, 3.0, 1.0, 5.0, 0.2, 0.1, 7.0, 0.3])
    scores = salience_scores(texts, surprisal)
    # words: The | river | Alder | rose | 3 | . | 5 | m | on | Monday | , | flooding
    words = [[0], [1], [2, 3], [4], [5], [6], [7], [8], [9], [10, 11], [12], [13, 14]]
    assert all(len({float(scores[i]) for i in word}) == 1 for word in words)  # a word's tokens share its score
    ranked = sorted(words, key=lambda word: -float(scores[word[0]]))
    # names and numbers first (The, Alder, 3, 5, Monday), each by its largest surprisal; then the rest by theirs
    assert ranked[:5] == [[2, 3], [5], [10, 11], [7], [0]]
    assert ranked[5:8] == [[13, 14], [4], [8]] and float(scores[2]) == float(scores[3]) == 1e4 + 9.0
    kept = select_topk(scores[None], torch.tensor([len(texts)]), ratio=3)[0][0].tolist()
    assert kept == [2, 3, 5, 10, 14]  # Alder and 3 whole, where the budget ends a part of Monday, the last token


def test_question_overlap_keeps_the_sentences_sharing_the_questions_words_first_then_by_salience():
    assert content_words("When did the dam open in 1931? Answer:") == {"when", "open", "1931", "answer"}  # no "dam"
    # sentences: The dam opened in 1931. | Floods came in May. | It rained.
    texts = [
        "The",
        " dam",
        " opened",
        " in",
        " 1931",
        ".",
        " Floods",
        " came",
        " in",
        " May",
        ".",
        " It",
        " rained",
        ".",
    ]
    surprisal = torch.tensor([0.0, 3.0, 2.0, 0.1, 8.0, 0.2, 6.0, 1.0, 0.1, 4.0, 0.3, 0.5, 2.5, 0.1])
    scores = question_overlap_scores(texts, content_words("Which month did the floods come?"), surprisal)
    order = torch.argsort(scores, descending=True).tolist()
    # the one sentence sharing a word ("floods") first, whole, in salience's order: names by surprisal, then the rest
    assert order[:5] == [6, 9, 7, 10, 8]
    # then the sentences sharing none, by salience alone: 1931, It, The, then dam, rained, opened by surprisal
    assert order[5:11] == [4, 11, 0, 1, 12, 2]
    assert scores.dtype == torch.float32 and bool((scores == scores.round()).all())  # integers: exact in float32
    kept = select_topk(scores[None], torch.tensor([len(texts)]), ratio=2.5)[0][0].tolist()
    assert kept == [6, 7, 8, 9, 10, 13]  # at ratio 2.5, 6 of 14: "Floods came in May." whole, and the last token


def test_straight_through_bias_is_zero_forward_with_a_gradient():
    scores = torch.tensor([0.5, -1.0], requires_grad=True)
    bias = straight_through_bias(scores)
    assert bias.tolist() == [0.0, 0.0]
    (bias * torch.tensor([2.0, 3.0])).sum().backward()
    assert scores.grad.tolist() == [2.0, 3.0]


@pytest.mark.parametrize("ratio", [0.5, 0, -3, True, "ten"])
def test_bad_ratios_fail(ratio):
    with pytest.raises(ValueError, match="ratio must be a number >= 1"):
        check_ratio(ratio)


def test_every_selector_name_has_its_class():
    from decodebench.models.nugget.config import SELECTOR_NAMES
    from decodebench.models.nugget.selectors import SELECTORS

    assert set(SELECTOR_NAMES) == set(SELECTORS) and all(SELECTORS[n].name == n for n in SELECTOR_NAMES)


def read_context(row: int) -> str:
    from decodebench.data.paths import TASKS_DIR
    from decodebench.data.taskdata import read_records

    return read_records(TASKS_DIR / "squad" / "squad_mini.jsonl")[row]["context"]


@pytest.mark.model
class TestNuggetModel:
    @pytest.fixture(scope="class")
    @classmethod
    def prompts(cls, tiny_checkpoint):
        from decodebench.data.paths import TASKS_DIR
        from decodebench.data.taskdata import read_records
        from decodebench.models.baseline import Baseline

        cls.checkpoint = str(tiny_checkpoint)
        base = Baseline.create({"pretrained": cls.checkpoint, "device": "cpu"})
        rows = read_records(TASKS_DIR / "squad" / "squad_mini.jsonl")[:2]
        texts = [
            f"{r['context']}\n\nBased on the provided document, answer the following question:\n{r['question']}"
            for r in rows
        ]
        prompts = [base.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
        reqs = [
            SimpleNamespace(
                task_name="t", doc_id=i, idx=0, args=(p, {"until": [], "max_gen_toks": 12, "do_sample": False})
            )
            for i, p in enumerate(prompts)
        ]
        return reqs, base.generate_until(reqs)

    def nugget(self, **args):
        from decodebench.models.nugget import Nugget

        return Nugget.create({"pretrained": self.checkpoint, "device": "cpu", **args})

    def test_full_context_reproduces_plain_decoding(self, prompts):
        reqs, reference = prompts
        assert self.nugget(selector="full").generate_until(reqs) == reference

    @pytest.mark.parametrize("selector", ["delimiter", "salience", "question-overlap", "streaming", "query-attention"])
    def test_compression_keeps_about_one_in_ratio_of_the_document(self, prompts, selector):
        reqs, _ = prompts
        model = self.nugget(selector=selector, ratio=10)
        outputs = model.generate_until(reqs)
        assert all(isinstance(o, str) for o in outputs)
        stats = model.decodebench_recorder.task_summaries()["t"]["method"]
        assert stats["compressed_requests"] == 2
        assert abs(stats["document_kv_fraction_kept"] - 1 / 10) <= 0.15 / 10
        for rec in model.decodebench_recorder.records:
            s = rec.method_stats
            assert s["nuggets"] == -(-s["document_tokens"] // 10)
            assert s["document_kv_bytes_kept"] * s["document_tokens"] == s["document_kv_bytes_full"] * s["nuggets"]

    @pytest.mark.parametrize("selector", ["delimiter", "salience", "question-overlap", "truncation", "query-attention"])
    def test_only_the_document_is_compressed_the_templates_opening_kept_whole(self, prompts, selector):
        """As the authors run it, for every selector: the chat template's system turn and user header are kept as
        they are, the ratio applies to the document (from the context's first word to the blank line), the
        question is fed after; ``wrapper=compressed`` compresses the opening with the document."""
        reqs, _ = prompts
        model = self.nugget(selector=selector, ratio=10)
        prompt = model.tok_encode(reqs[0].args[0])
        row = model.method.compress(model, prompt)
        opening, document = row.stats["opening_tokens"], row.stats["document_tokens"]
        text = model.tokenizer.decode
        assert text(prompt[:opening]).endswith("<|im_start|>user\n") and "system" in text(prompt[:opening])
        assert text(prompt[opening : opening + document]).startswith(read_context(0)[:40])
        assert (
            row.stats["nuggets"] == -(-document // 10) and row.layers[0][0].shape[2] == opening + row.stats["nuggets"]
        )
        assert row.start == opening + document and text(row.tail).lstrip().startswith("Based on the provided document")
        together = self.nugget(selector=selector, ratio=10, wrapper="compressed").method.compress(model, prompt)
        assert together.stats["opening_tokens"] == 0 and together.stats["document_tokens"] == opening + document
        plain = model.tok_encode(read_context(0) + "\n\nWhat is it about?")  # no template: nothing before it
        assert model.method.opening_length(model, plain, model.method.split_point(model, plain)) == 0

    @pytest.mark.parametrize("selector", ["delimiter", "salience", "question-overlap", "query-attention"])
    def test_a_batch_decodes_what_each_row_decodes_alone(self, prompts, selector):
        """Rows of different lengths (one left uncompressed) decoded together give batch 1's greedy answers and
        statistics; only the cache held at decode start counts the batch's padding."""
        reqs, _ = prompts
        short = SimpleNamespace(
            task_name="t", doc_id=2, idx=0, args=("Tiny.\n\nWhat is it?", {"until": [], "max_gen_toks": 12})
        )
        reqs = [*reqs, short]
        alone = self.nugget(selector=selector, ratio=10, batch_size=1)
        together = self.nugget(selector=selector, ratio=10, batch_size=3)
        assert together.generate_until(reqs) == alone.generate_until(reqs)
        volatile = {"kv_bytes_at_decode_start"}

        def stats(model):
            by_doc = {rec.doc_id: rec.method_stats for rec in model.decodebench_recorder.records}
            return {doc: {k: v for k, v in s.items() if k not in volatile} for doc, s in by_doc.items()}

        assert stats(together) == stats(alone)
        assert stats(alone)[2]["document_tokens"] == 0 and stats(alone)[0]["nuggets"] > 0

    def test_the_split_puts_the_question_in_the_uncompressed_tail(self, prompts):
        reqs, _ = prompts
        model = self.nugget(selector="delimiter")
        ids = model.tok_encode(reqs[0].args[0])
        n = model.method.split_point(model, ids)
        assert model.tokenizer.decode(ids[n:]).lstrip().startswith("Based on the provided document")
        assert model.method.split_point(model, model.tok_encode("no blank line here")) == 0

    def test_short_documents_and_prompts_without_a_split_are_left_alone(self, prompts):
        model = self.nugget(selector="delimiter", ratio=10)
        reqs = [
            SimpleNamespace(
                task_name="t", doc_id=0, idx=0, args=("Tiny.\n\nWhat is it?", {"until": [], "max_gen_toks": 4})
            )
        ]
        model.generate_until(reqs)
        assert model.decodebench_recorder.task_summaries()["t"]["method"]["uncompressed_requests"] == 1

    def test_query_attention_scores_are_the_attention_the_question_pays_one_layer_at_a_time(self, prompts):
        """The bounded tally equals the sum of eager attention maps from the question to the document."""
        from decodebench.models.nugget.selectors import QueryAttentionSelector

        reqs, _ = prompts
        model = self.nugget(selector="query-attention")
        ids = model.tok_encode(reqs[0].args[0])
        n = model.method.split_point(model, ids)
        document, tail = torch.tensor([ids[:n]]), ids[n:]
        tally = QueryAttentionSelector(model.method.config).scores(model, document, tail)
        model.model.set_attn_implementation("eager")
        try:
            maps = model.model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
        finally:
            model.model.set_attn_implementation("sdpa")
        expected = sum(layer[0, :, n:, :n].sum(dim=(0, 1)) for layer in maps)
        torch.testing.assert_close(tally, expected.float(), rtol=1e-4, atol=1e-5)

    def test_the_old_attention_name_says_what_it_became(self):
        with pytest.raises(ValueError, match="selector=attention is now called query-attention"):
            self.nugget(selector="attention")

    def test_ratio_below_one_fails_before_loading(self):
        from decodebench.models.nugget import Nugget

        with pytest.raises(ValueError, match=r"ratio must be a number >= 1 \(1 keeps every token\), got 0\.5"):
            Nugget.create({"ratio": 0.5})


@pytest.mark.slow
@pytest.mark.model
def test_on_the_embedded_model_a_batch_of_4_answers_as_batch_1(embedded_checkpoint, tmp_path):
    """squad_mini through the real lm_eval (documents of 37 to 179 tokens: rows of different lengths, padded), the
    shipped trained compressor (the paper's method, ``selector=trained``: adapters and soft token) at ratio 5, the
    paths a batch can break that the default answer-span scorer does not take: the same greedy answers
    at --batch_size 4 as at 1, the per-row cache held at decode start at least the row's own, and the results name
    the checkpoint by its manifest's sha256. (12 new tokens: what padding breaks shows from the first; batch 8 and
    cnndm_mini's 700-token articles cost 2x and 4x the time and test nothing more here; the GPU command runs batch 8
    on both tasks.)"""
    from conftest import lm_eval_in_process, read_results, read_samples

    from decodebench.models.nugget.shipped import shipped_checkpoint, verify

    answers, stats = {}, {}
    for batch in ("1", "4"):
        out = tmp_path / f"batch-{batch}"
        lm_eval_in_process(
            *("--model", "nugget", "--model_args", "pretrained=embedded,ratio=5,selector=trained"),
            *("--tasks", "squad_mini", "--limit", "4", "--batch_size", batch),
            *("--gen_kwargs", "max_gen_toks=12", "--apply_chat_template", "--output_path", str(out), "--log_samples"),
            cwd=tmp_path,
        )
        answers[batch] = {s["doc_id"]: s["resps"][0][0] for s in read_samples(out, "squad_mini")}
        stats[batch] = read_results(out)["config"]["decodebench"]["tasks"]["squad_mini"]["method"]
    assert answers["4"] == answers["1"]
    assert stats["4"]["compressed_requests"] == stats["1"]["compressed_requests"] == 4
    # held per row physically: with the batch's padding, never less than a row alone holds
    assert stats["4"]["kv_bytes_at_decode_start"] >= stats["1"]["kv_bytes_at_decode_start"]
    assert stats["1"]["checkpoint_sha256"] == verify(shipped_checkpoint(5), required=True)["sha256"]
    assert stats["1"]["selector"].startswith("the paper's nugget: trained scorer + LoRA encoder/decoder")


def test_span_scores_keep_predicted_spans_whole_and_each_text_once():
    texts = ["Kel", "vin", " Benjamin", " tore", " his", " AC", "L", " in", " 55", ",", "000", ",", " Kelvin"]
    texts += [" Benjamin", " said", ".\n", "Benjamin"]
    logits = torch.tensor([4.0, -9.0, 1.0, -6.0, -8.0, 3.0, 0.5, -8.0, 2.0, -9.0, -9.0, -9.0, 5.0, 5.0, -5.0, -9, 6.0])
    scores = span_scores(texts, logits)
    # "Kelvin Benjamin": one span, its best word's logit; "ACL" one word; "55,000" one word, the comma after it not
    assert scores[:3].tolist() == [4.0] * 3 and scores[5:7].tolist() == [3.0] * 2 and scores[8:11].tolist() == [2.0] * 3
    assert scores[11] == -9.0 and scores[3] == -6.0
    # "his" (-8) is below the threshold: "tore his" stays two words, "in" a word of its own
    assert scores[4] == -8.0 and scores[7] == -8.0
    # the second "Kelvin Benjamin" ranks after every first mention; "Benjamin" after a line break is a span of its own
    assert scores[12:14].tolist() == [5.0 - REPEATED_LAST] * 2 and scores[16] == 6.0
    indices, _ = select_topk(scores[None], torch.tensor([17]), 17 / 9, force_last=False)
    assert indices[0].tolist() == [0, 1, 2, 5, 6, 8, 9, 10, 16]  # whole spans, best first; no repeat
    assert span_scores([], torch.zeros(0)).tolist() == []


@pytest.mark.slow
@pytest.mark.model
def test_the_shipped_answer_span_scorer_runs_on_the_embedded_model_at_both_ratios(embedded_checkpoint):
    """``selector=answer-spans``, the default (at ratio 10 it runs unnamed, as ``--model nugget`` does): the file its
    manifest names, whole spans kept, the opening kept whole, one scorer for ratio 5 and 10 (its quality:
    docs/nugget-study-peers.md)."""
    from decodebench.models.nugget import Nugget
    from decodebench.models.nugget.compressor import encode_nuggets
    from decodebench.models.nugget.shipped import shipped_span_scorer, verify

    context = read_context(0)
    request = SimpleNamespace(
        task_name="t",
        doc_id=0,
        idx=0,
        args=(f"{context}\n\nBased on the provided document, answer the following question:\nWhat?", {}),
    )
    for ratio in (5, 10):
        named = {"selector": "answer-spans"} if ratio == 5 else {}
        model = Nugget.create({"pretrained": str(embedded_checkpoint), "device": "cpu", "ratio": ratio, **named})
        assert model.method.config.selector == "answer-spans"
        prompt = model.tok_encode(model.apply_chat_template([{"role": "user", "content": request.args[0]}]))
        n = model.method.split_point(model, prompt)
        opening = model.method.opening_length(model, prompt, n)
        scores = model.method.selector.scores(model, torch.tensor([prompt[:n]]), prompt[n:])
        indices, _ = select_topk(scores[None], torch.tensor([n]), ratio, kept_whole=torch.tensor([opening]))
        kept = set(indices[0].tolist())
        # as it runs, its scores read from the encoding pass: the same tokens kept
        shared = model.method.selector.encoding_scores(model, torch.tensor([prompt[:n]]), prompt[n:])
        assert torch.equal(
            encode_nuggets(model.model, torch.tensor([prompt[:n]]), shared, ratio, False, opening).indices, indices
        )
        assert set(range(opening)) <= kept and len(kept) == opening + -(-(n - opening) // ratio)
        # every span (its tokens share its score) kept whole, but for the last one the budget reaches
        dropped = {float(scores[i]) for i in range(n) if i not in kept}
        broken = {float(scores[i]) for i in kept if i >= opening} & dropped
        assert len(broken) <= 1
        summary = model.method.summarize([])
        assert summary["checkpoint_sha256"] == verify(shipped_span_scorer(), required=True)["sha256"]
