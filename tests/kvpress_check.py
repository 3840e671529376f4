"""studies/kvpress_peers.py's ``fit`` on kvpress 0.5.5's own presses and the embedded model, in the kvpress
environment (``tox -e kvpress``; kvpress needs transformers<5.3, so the main test suite cannot import it): each
press keeps the chat template's opening whole and ceil(D / ratio) of the document's D tokens, the nugget study's
budget, whatever share kvpress would have dropped by default."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "studies"))
import kvpress_peers

DOCUMENT = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in "
    "France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway who, under their "
    "leader Rollo, agreed to swear fealty to King Charles III of West Francia. Through generations of assimilation "
    "and mixing with the native Frankish and Roman-Gaulish populations, their descendants would gradually merge "
    "with the Carolingian-based cultures of West Francia. The distinct cultural and ethnic identity of the Normans "
    "emerged initially in the first half of the 10th century, and it continued to evolve over the succeeding "
    "centuries."
)


@pytest.fixture(scope="module")
def pipe():
    import kvpress  # noqa: F401  (registers kvpress's pipeline)
    from transformers import pipeline

    models = sorted(Path(os.environ["DECODEBENCH_HOME"], "models").glob("SmolLM2-135M-Instruct*"))
    assert models, "the embedded model is not unpacked under $DECODEBENCH_HOME/models: run `tox -e demo` first"
    return pipeline("kv-press-text-generation", model=str(models[-1]), device="cpu", dtype=torch.float32)


def compressed(pipe, press, ratio: float):
    """The cache after prefilling the opening and DOCUMENT with ``press`` fitted, and the plain cache."""
    from transformers import DynamicCache

    item = {"task": "squad_mini", "doc_id": 0, "document": DOCUMENT, "question": "\n\nWho was Rollo?"}
    opening, document = kvpress_peers.split_context(pipe, item)
    context = pipe.preprocess(DOCUMENT, [item["question"]], "", max_context_length=2**31)["context_ids"]
    caches = []
    for fitted in (kvpress_peers.fit(press, opening, document, ratio), None):
        cache = DynamicCache()
        with torch.inference_mode(), fitted(pipe.model) if fitted else contextlib.nullcontext():
            pipe.model.model(input_ids=context, past_key_values=cache)
        caches.append(cache)
    return opening, document, *caches


@pytest.mark.parametrize("name", ["Expected Attention", "KNorm", "StreamingLLM", "TOVA", "SnapKV"])
@pytest.mark.parametrize("ratio", [5.0, 10.0])
def test_a_press_keeps_the_opening_and_the_documents_budget(pipe, name, ratio):
    press = kvpress_peers.make_presses([name])[name]
    opening, document, cache, plain = compressed(pipe, press, ratio)
    budget = opening + math.ceil(document / ratio)
    for layer, whole in zip(cache.layers, plain.layers, strict=True):
        assert layer.keys.shape[2] == budget, (name, layer.keys.shape, budget)
        kept = layer.keys[0, :, :, :]
        # every opening position is kept: each of its keys is among the kept ones, in every head
        for position in range(opening):
            matches = (kept == whole.keys[0, :, position : position + 1, :]).all(dim=-1).any(dim=-1)
            assert matches.all(), (name, position)


@pytest.mark.parametrize("ratio", [5.0, 10.0])
def test_pyramidkv_gives_every_layer_the_same_budget_on_a_document_this_short(pipe, ratio):
    """kvpress's PyramidKV falls back to one budget for all layers unless its smallest layer's budget reaches its
    window (64) with beta 20: a context keeping over 1280 tokens. The study's documents keep far fewer, so there it
    runs as SnapKV; the page says so."""
    press = kvpress_peers.make_presses(["PyramidKV"])["PyramidKV"]
    opening, document, cache, _ = compressed(pipe, press, ratio)
    assert {layer.keys.shape[2] for layer in cache.layers} == {opening + math.ceil(document / ratio)}


@pytest.mark.parametrize("ratio", [5.0, 10.0])
def test_kvzip_masks_all_but_the_budget_and_never_the_opening(pipe, ratio):
    press = kvpress_peers.make_presses(["KVzip"])["KVzip"]
    masked = []
    compress_post = press.compress_post

    def recording(model):  # kvpress clears the masks when its context ends
        compress_post(model)
        masked.extend(layer.self_attn.masked_key_indices[2] for layer in model.model.layers)

    press.compress_post = recording
    opening, document, _, _ = compressed(pipe, press, ratio)
    budget = opening + math.ceil(document / ratio)
    assert press.kept_share == pytest.approx(budget / (opening + document), abs=1 / (opening + document))
    assert len(masked) == len(pipe.model.model.layers)
    assert all((positions >= opening).all() for positions in masked)


def test_the_pipeline_without_a_press_scores_as_lm_evals_full_context_run(pipe):
    """The control the study's comparison rests on: kvpress's pipeline (the document prefilled, then the question)
    scores the first squad_mini questions as the study's own full-context lm_eval run did (one prompt, batch 8),
    so a press's score differs from the default's by what each keeps, not by the pipeline. The prompt is
    tasks/squad/_squad_yaml's ``doc_to_text``."""
    import json
    import lzma

    root = Path(__file__).resolve().parents[1]
    data = root / "docs" / "data"
    where = json.loads((data / "nugget-study-kvpress" / "runs.json").read_text())["full"]["squad_mini"]
    (samples,) = (data / "nugget-runs" / where).glob("samples_*")
    with lzma.open(samples, "rt") as lines:
        kept = {sample["doc_id"]: sample["normalized_accuracy"] for sample in map(json.loads, lines)}
    with open(root / "tasks" / "squad" / "squad_mini.jsonl") as lines:
        docs = [json.loads(line) for _, line in zip(range(20), lines, strict=False)]
    for doc_id, doc in enumerate(docs):
        question = "\n\nBased on the provided document, answer the following question:\n" + doc["question"]
        answer = pipe(doc["context"], question=question, max_new_tokens=64)["answer"]
        assert kvpress_peers.score("squad_mini", answer, doc["answers"]["text"]) == kept[doc_id], doc_id


def squad_items(count: int) -> list[dict]:
    """The first squad_mini questions as the study's items (tasks/squad/_squad_yaml's prompt, split before the
    question as ``--model nugget`` splits it)."""
    import json

    root = Path(__file__).resolve().parents[1]
    with open(root / "tasks" / "squad" / "squad_mini.jsonl") as lines:
        docs = [json.loads(line) for _, line in zip(range(count), lines, strict=False)]
    return [
        {
            "task": "squad_mini",
            "doc_id": doc_id,
            "document": doc["context"],
            "question": "\n\nBased on the provided document, answer the following question:\n" + doc["question"],
            "max_new": 64,
            "stop": [],
            "references": doc["answers"]["text"],
        }
        for doc_id, doc in enumerate(docs)
    ]


@pytest.mark.parametrize("name", list(kvpress_peers.PRESSES))
def test_documents_decoded_together_answer_as_the_pipeline_does_one_at_a_time(pipe, name):
    """The study decodes 16 compressed documents together (each compressed alone); kvpress's pipeline answers one
    at a time. Documents of different lengths (so rows are padded) and, for KVzip, masked pairs moved to their row:
    the same answers and the same kept bytes."""
    items = squad_items(6)
    for item in items:
        item["opening"], item["document_tokens"] = kvpress_peers.split_context(pipe, item)
    # SnapKV's and PyramidKV's window must fit in the context (the study leaves the others out of their rows)
    items = [item for item in items if item["opening"] + item["document_tokens"] > 64]
    assert len({item["document_tokens"] for item in items}) > 1
    press = kvpress_peers.make_presses([name])[name]

    def fitted(item):
        return kvpress_peers.fit(press, item["opening"], item["document_tokens"], 5.0)

    one_at_a_time = kvpress_peers.answer_compressed(pipe, items, fitted, batch=1)
    together = kvpress_peers.answer_compressed(pipe, items, fitted, batch=len(items))
    assert together == one_at_a_time


def test_a_run_stopped_midway_goes_on_from_its_last_batch(pipe, tmp_path, monkeypatch):
    """--out is written after each batch; started again, a run answers only what is missing and names a press
    finished only once all its documents are answered."""
    import json

    items = tmp_path / "items.json"
    items.write_text(json.dumps(squad_items(3)))
    out = tmp_path / "peers.json"
    checkpoint = pipe.model.config.name_or_path
    command = ["--checkpoint", checkpoint, "--ratio", "5", "--items", str(items), "--out", str(out)]
    command += ["--presses", "KNorm", "--batch-size", "2"]
    assert kvpress_peers.main(command) == 0
    whole = json.loads(out.read_text())
    assert whole["finished"] == ["KNorm"] and len(whole["KNorm"]["squad_mini"]["scores"]) == 3
    # as if stopped after the first batch: the last answered document (the entries keep the order answered)
    stopped = json.loads(out.read_text())
    stopped["finished"] = []
    last = list(stopped["KNorm"]["squad_mini"]["scores"])[-1]
    del stopped["KNorm"]["squad_mini"]["scores"][last]
    for key in ("document_kv_bytes", "document_tokens"):
        stopped["KNorm"]["squad_mini"][key] = stopped["KNorm"]["squad_mini"][key][:2]
    out.write_text(json.dumps(stopped))
    answered = []
    original = kvpress_peers.answer_compressed
    monkeypatch.setattr(
        kvpress_peers,
        "answer_compressed",
        lambda pipe, batch, *rest: answered.extend(i["doc_id"] for i in batch) or original(pipe, batch, *rest),
    )
    assert kvpress_peers.main(command) == 0
    again = json.loads(out.read_text())
    assert answered == [int(last)]
    assert again["finished"] == ["KNorm"]
    assert again["KNorm"]["squad_mini"]["scores"] == whole["KNorm"]["squad_mini"]["scores"]
    assert sorted(again["KNorm"]["squad_mini"]["document_tokens"]) == sorted(
        whole["KNorm"]["squad_mini"]["document_tokens"]
    )
