"""``decodebench train-nugget``: the paper's compressor, trained as in its zero-shot scenario.

Qin et al. (sections 2.3-2.4, appendix B, section 6's zero-shot setting) train, on plain text cut
into a part to compress and a part to continue, the scorer over layer 3 of the frozen model, the
encoder and decoder LoRA adapters (rank 32) and the soft token, with the straight-through
estimator (eq. 18). One step here (``compression_loss``):

1. the scorer scores the compressed part's tokens from the frozen model's layer-3 states;
2. the encoder adapter encodes that part and ``ceil(n / ratio)`` positions of every layer's cache
   are kept (the last one always);
3. the decoder adapter reads [nuggets; soft token; continuation] and is scored on predicting the
   continuation; the nugget columns of its attention mask carry ``s - StopGrad(s)``, so the
   scores learn from every attention logit that reaches their nugget.

What is scaled down for two CPU cores, and why: the paper's parts are up to 512 and 128 tokens
and it trains for up to 150k steps with Adam (lr 1e-4, betas 0.9/0.95, eps 1e-5, 2k warm-up steps,
cosine); here the parts are up to ``context`` (256) and ``continuation`` (64) tokens and the
budget is ``steps`` (about an hour for the embedded model), so the learning rate is higher
(5e-4), the warm-up 5% of the steps, then cosine to zero. Everything else is the paper's.

The corpus is plain text sharing no text with the evaluation data: any document that shares a
13-word sequence with the bundled evaluation samples (squad_mini, cnndm_mini) is dropped, and
how many were is recorded. A held-out 3% of the documents (by a hash of their text) gives the
held-out loss reported at the start, during training and at the end. The run keeps a resume
file beside the checkpoint every ``save_every`` steps; running the same command again continues
from it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path

import torch

from decodebench.models.nugget.checkpoint import model_identity, save_checkpoint
from decodebench.models.nugget.compressor import (
    NuggetAdapters,
    NuggetScorer,
    encode_nuggets,
    layer_hidden_states,
    nugget_attention_mask,
)
from decodebench.models.nugget.training_settings import TrainingSettings

SHINGLE_WORDS = 13  # the n-gram length of the usual contamination checks


# -- corpus ---------------------------------------------------------------------------------
def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def shingles(text: str) -> set[int]:
    words = _words(text)
    return {
        int.from_bytes(hashlib.blake2b(" ".join(words[i : i + SHINGLE_WORDS]).encode(), digest_size=8).digest())
        for i in range(max(0, len(words) - SHINGLE_WORDS + 1))
    }


def evaluation_texts() -> Iterable[str]:
    """The texts of the bundled evaluation samples that a training corpus must not contain."""
    from decodebench.paths import TASKS_DIR

    for file, fields in (
        ("squad/squad_mini.jsonl", ("context", "question")),
        ("cnndm/cnndm_mini.jsonl", ("article", "highlights")),
    ):
        with open(Path(TASKS_DIR) / file, encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                yield from (str(record[f]) for f in fields if record.get(f))


def read_documents(corpus: str | None) -> tuple[list[str], str]:
    """Documents of ``corpus`` (decodebench.corpus: .jsonl, .txt or a folder; default: Python's reference
    documentation) and what it is, for the record."""
    from decodebench.corpus import REFERENCE_CORPUS, read_corpus, reference_corpus

    if corpus is None:
        return reference_corpus(), REFERENCE_CORPUS
    return list(read_corpus(Path(corpus))), str(corpus)


def split_corpus(documents: list[str]) -> tuple[list[str], list[str], int]:
    """(training documents, held-out documents, documents dropped for sharing text with evaluation data)."""
    evaluation: set[int] = set()
    for text in evaluation_texts():
        evaluation |= shingles(text)
    kept = [d for d in documents if not (shingles(d) & evaluation)]
    held_out = [hashlib.sha256(d.encode()).digest()[0] < 8 for d in kept]  # 8/256: about 3%
    training = [d for d, held in zip(kept, held_out, strict=True) if not held]
    held = [d for d, held in zip(kept, held_out, strict=True) if held]
    if not held:  # a corpus too small for the hash to pick any: hold out its last documents
        held = training[-max(1, len(training) // 30) :]
        training = training[: len(training) - len(held)]
    return training, held, len(documents) - len(kept)


def corpus_record(documents: list[str], training: list[str], held: list[str], dropped: int) -> dict:
    """What a manifest says about the corpus: how many documents trained, were held out, were dropped."""
    return {
        "documents": len(documents),
        "dropped_for_sharing_text_with_evaluation_samples": dropped,
        "held_out": len(held),
        "held_out_rule": "sha256 of the document's text, first byte < 8 (about 3%)",
        "trained_on": len(training),
    }


class Windows:
    """Random (compressed part, continuation) token windows from tokenized documents."""

    def __init__(self, tokenizer, documents: list[str], settings: TrainingSettings):
        self.settings = settings
        minimum = int(2 * settings.ratio) + settings.continuation
        self.documents = [
            ids for ids in (tokenizer(d, add_special_tokens=False).input_ids for d in documents) if len(ids) >= minimum
        ]
        if not self.documents:
            raise ValueError(f"no document has the {minimum} tokens a training window needs")

    def sample(self, rng: random.Random) -> tuple[list[int], list[int]]:
        s = self.settings
        tokens = rng.choice(self.documents)
        longest = min(s.context, len(tokens) - s.continuation)
        n = rng.randint(min(longest, max(int(2 * s.ratio), s.context // 4)), longest)
        start = rng.randint(0, len(tokens) - n - s.continuation)
        window = tokens[start : start + n + s.continuation]
        return window[:n], window[n:]


def held_out_windows(tokenizer, held_docs: list[str], settings: TrainingSettings, count: int):
    """The held-out windows training reports its loss on (a fixed draw: the first ``count`` are
    always the same for the same documents and settings)."""
    windows, rng = Windows(tokenizer, held_docs, settings), random.Random(settings.seed + 1)
    return [windows.sample(rng) for _ in range(count)]


# -- the objective ---------------------------------------------------------------------------
def compression_loss(
    model,
    scorer: NuggetScorer,
    adapters: NuggetAdapters,
    context: list[int],
    continuation: list[int],
    ratio: float,
    autocast: bool = True,
) -> torch.Tensor:
    """Mean negative log-likelihood of ``continuation`` given the nuggets of ``context`` (eqs. 12-18)."""
    device = next(model.parameters()).device
    # mixed precision, as the paper trains (bfloat16 matrix products, float32 weights and loss)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        return _compression_loss(model, scorer, adapters, context, continuation, ratio, device)


def _compression_loss(model, scorer, adapters, context, continuation, ratio, device) -> torch.Tensor:
    document = torch.tensor([context], device=device)
    n = len(context)
    scores = scorer(layer_hidden_states(model, document, scorer.layer).float())  # [n]
    nuggets = encode_nuggets(model, document, scores, ratio, encoder=True)
    adapters.use("decoder", trainable=torch.is_grad_enabled())
    targets = torch.tensor(continuation, device=device)
    embedded = model.get_input_embeddings()(targets)
    embeds = torch.cat([adapters.soft_token[None].to(embedded.dtype), embedded])[None]
    length = embeds.shape[1]
    logits = model(
        inputs_embeds=embeds,
        past_key_values=nuggets.cache,
        attention_mask=nugget_attention_mask(scores[nuggets.indices[0]], length, _compute_dtype(model, device)),
        position_ids=torch.arange(n, n + length, device=device)[None],
    ).logits[0]
    # the soft token predicts the first continuation token, each token the next
    return torch.nn.functional.cross_entropy(logits[:-1].float(), targets)


def _compute_dtype(model, device) -> torch.dtype:
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return model.get_input_embeddings().weight.dtype


@torch.no_grad()
def held_out_loss(model, scorer, adapters, windows: list[tuple[list[int], list[int]]], ratio: float) -> float:
    losses = [float(compression_loss(model, scorer, adapters, c, t, ratio)) for c, t in windows]
    return sum(losses) / len(losses)


# -- training ----------------------------------------------------------------------------------
def default_checkpoint(model_name: str, ratio: float) -> Path:
    """Where ``train-nugget`` saves by default (the shipped compressors are in models/nugget/weights/)."""
    from decodebench.paths import home

    return home() / "nugget" / f"{model_name}-r{ratio:g}.safetensors"


def _learning_rate(step: int, settings: TrainingSettings) -> float:
    """Linear warm-up, then cosine to zero (the paper's schedule, shortened)."""
    warmup = max(1, int(settings.warmup * settings.steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, settings.steps - warmup)
    return 0.5 * (1 + math.cos(math.pi * progress))


def train(
    model_path: str,
    out: str | Path,
    settings: TrainingSettings | None = None,
    corpus: str | None = None,
    model_name: str | None = None,
    log: Callable[[str], None] = print,
    progress: bool = True,
    command: str = "decodebench train-nugget (from Python)",
) -> Path:
    """Train (or resume training) and save the checkpoint at ``out`` with its manifest beside it
    (models/nugget/shipped.py: ``command``, the corpus split, the losses, the revision, the sha256); returns its
    path."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodebench.models.nugget.shipped import write_manifest

    settings = settings or TrainingSettings()
    settings.check()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    resume_path = out.with_name(out.name + ".resume.pt")
    documents, corpus_name = read_documents(corpus)
    training_docs, held_docs, dropped = split_corpus(documents)
    log(
        f"corpus: {corpus_name}: {len(documents)} documents, {dropped} dropped for sharing text with the evaluation "
        f"samples, {len(held_docs)} held out"
    )

    torch.manual_seed(settings.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if not 0 <= settings.layer <= model.config.num_hidden_layers:
        raise ValueError(f"layer must be in 0..{model.config.num_hidden_layers}, got {settings.layer}")
    scorer = NuggetScorer(model.config.hidden_size, settings.layer)
    adapters = NuggetAdapters(model, settings.rank)
    trained = [*scorer.parameters(), *adapters.parameters("encoder"), *adapters.parameters("decoder")]
    trained.append(adapters.soft_token)
    optimizer = torch.optim.Adam(trained, lr=settings.lr, betas=(0.9, 0.95), eps=1e-5)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _learning_rate(step, settings))

    rng = random.Random(settings.seed)
    train_windows = Windows(tokenizer, training_docs, settings)
    held_windows = held_out_windows(tokenizer, held_docs, settings, settings.held_out_windows)
    record = {
        "settings": asdict(settings),
        "corpus": corpus_name,
        "dropped_documents": dropped,
        "losses": [],
        "held_out": [],
    }
    start = 0
    if resume_path.is_file():
        start = _resume(resume_path, settings, scorer, adapters, optimizer, schedule, rng, record)
        log(f"resuming from step {start} ({resume_path})")
    else:
        record["held_out"].append([0, held_out_loss(model, scorer, adapters, held_windows, settings.ratio)])
        log(f"held-out loss before training: {record['held_out'][0][1]:.3f}")

    bar = tqdm(total=settings.steps, initial=start, desc="train-nugget", disable=not progress)
    started = time.perf_counter()
    for step in range(start, settings.steps):
        context, continuation = train_windows.sample(rng)
        loss = compression_loss(model, scorer, adapters, context, continuation, settings.ratio)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        schedule.step()
        record["losses"].append(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{sum(record['losses'][-20:]) / len(record['losses'][-20:]):.3f}")
        done = step + 1
        if done % settings.eval_every == 0 or done == settings.steps:
            held = held_out_loss(model, scorer, adapters, held_windows, settings.ratio)
            record["held_out"].append([done, held])
            log(f"step {done}: held-out loss {held:.3f}")
        if done % settings.save_every == 0 or done == settings.steps:
            _save_resume(resume_path, done, scorer, adapters, optimizer, schedule, rng, record)
    bar.close()
    record["seconds_this_run"] = time.perf_counter() - started
    training = {key: record[key] for key in ("settings", "corpus", "dropped_documents", "held_out", "seconds_this_run")}
    training["steps_done"] = settings.steps
    path = save_checkpoint(out, scorer, adapters, model_identity(model, tokenizer), settings.ratio, training)
    (out.with_name(out.name + ".log.json")).write_text(json.dumps(record, indent=1))
    write_manifest(path, command, corpus_record(documents, training_docs, held_docs, dropped), torch.get_num_threads())
    first, last = record["held_out"][0][1], record["held_out"][-1][1]
    log(
        f"saved {path}: held-out loss {first:.3f} -> {last:.3f} "
        f"(perplexity {math.exp(first):.1f} -> {math.exp(last):.1f})"
    )
    return path


def _save_resume(path: Path, step: int, scorer, adapters, optimizer, schedule, rng, record) -> None:
    state = {
        "step": step,
        "scorer": scorer.state_dict(),
        "adapters": adapters.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "rng": json.dumps(rng.getstate()),
        "torch_rng": torch.get_rng_state(),
        "record": json.dumps(record),
    }
    partial = path.with_name(f".{path.name}.partial")
    torch.save(state, partial)
    os.replace(partial, path)


def _resume(path: Path, settings, scorer, adapters, optimizer, schedule, rng, record) -> int:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain values only
        saved = json.loads(state["record"])
    except Exception as exc:  # a cut or foreign file: torch says only what failed inside it
        raise ValueError(
            f"the resume file {path} cannot be read ({type(exc).__name__}: {str(exc)[:200]}); it is cut or not one "
            "of train-nugget's: delete it to start over, or give another --out"
        ) from None
    if saved["settings"] != asdict(settings):
        changed = {k: (v, asdict(settings)[k]) for k, v in saved["settings"].items() if asdict(settings).get(k) != v}
        raise ValueError(
            f"{path} was made with other settings {changed} (saved, now); rerun with the same settings to resume, "
            "or give another --out"
        )
    scorer.load_state_dict(state["scorer"])
    adapters.load_state_dict(state["adapters"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    version, internal, gauss = json.loads(state["rng"])
    rng.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch_rng"])
    record.update(saved)
    return int(state["step"])
