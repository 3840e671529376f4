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

Two other layouts can be asked for (``TrainingSettings.autoencode``, ``chat``): a share of windows whose
target is the compressed part itself (the paper's autoencoding objective, section 4; an instruction after
the soft token says which is asked), and windows laid out in the model's chat template as decodebench's
tasks prompt it. On the embedded model both answered fewer held-out SQuAD questions than plain continuation
and drifted into repetition in short trials (400 steps at ratio 5, 100 dev questions squad_mini does not use;
not yet a committed study), so the defaults are the paper's zero-shot layout.

What is scaled down for two CPU cores, and why: the paper's parts are up to 512 and 128 tokens
and it trains for up to 150k steps with Adam (lr 1e-4, betas 0.9/0.95, eps 1e-5, 2k warm-up steps,
cosine); here the parts are up to ``context`` (256) and ``continuation`` (64) tokens and the
budget is ``steps`` (about 1.5 hours for the embedded model on one core), so the learning rate
is higher (5e-4), the warm-up 5% of the steps, then cosine to zero. Everything else is the paper's.

How a step runs (not what it learns): its windows go through the model ``micro_batch`` at a time, right-padded into
one forward pass of the scorer, the encoder and the decoder each (``compression_losses``: every window's loss and
gradients are those it has alone, up to rounding), in bfloat16 mixed precision where the device has bfloat16
(``mixed_precision``) and float32 where it would be emulated.

Where the paper is silent, the authors' code decides (``--recipe authors``, training_settings.AUTHORS_RECIPE;
the defaults stay what the shipped checkpoints were trained with): their Dodo training code's windows (one
document each, BOS first, a fake EOS: ``DocumentWindows``), LoRA on ``q_proj``, ``v_proj`` and ``o_proj`` with
dropout 0.1, AdamW with weight decay 0.1 (and a learning rate of the adapters' own, ``lora_lr``), and a batch of
windows per step (``accumulate``; the authors' batches are 1 per GPU on 16 GPUs, times 2 accumulated); their nugget
library's scorer features (layer 3 through the final RMSNorm, ``NuggetScorer.feature_norm``). Not offered: the Dodo
code's residual alternative to the straight-through estimator (the paper and library use the estimator, as here).

The corpus is plain prose that no task evaluates on (by default three dictionaries that Debian
packages: FOLDOC, the Jargon File and The Devil's Dictionary, harness/data/corpus.py; the paper's general
web text cannot be downloaded here), and any document that shares a 13-word sequence with the
bundled evaluation samples (squad_mini, cnndm_mini) is dropped, and how many were is recorded. A
held-out 3% of the documents (by a hash of their text) gives the held-out loss reported at the
start, during training and at the end. The run keeps a resume
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
import string
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from decodebench.models.nugget.checkpoint import model_identity, save_checkpoint
from decodebench.models.nugget.compressor import (
    NuggetAdapters,
    NuggetScorer,
    chat_template_parts,
    encode_nuggets,
    missing_modules,
    nugget_attention_mask,
    projections,
)
from decodebench.models.nugget.training_settings import MICRO_BATCH, TrainingSettings, check_micro_batch

SHINGLE_WORDS = 13  # the n-gram length of the usual contamination checks
# what a window asks of the nuggets: the paper's autoencoding (section 4) or its zero-shot continuation (section 6)
AUTOENCODE = "Repeat the document above."
CONTINUE = "Continue the document above."


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
    from decodebench.data.paths import TASKS_DIR

    for file, fields in (
        ("squad/squad_mini.jsonl", ("context", "question")),
        ("cnndm/cnndm_mini.jsonl", ("article", "highlights")),
    ):
        with open(Path(TASKS_DIR) / file, encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                yield from (str(record[f]) for f in fields if record.get(f))


def read_documents(corpus: str | None) -> tuple[list[str], str]:
    """Documents of ``corpus`` (decodebench.data.corpus: .jsonl, .txt, a dictd index or a folder; default: the prose
    of three Debian dictionaries, ``PROSE_CORPUS``) and what it is, for the record."""
    from decodebench.data.corpus import PROSE_CORPUS, prose_corpus, read_corpus

    if corpus is None or corpus == PROSE_CORPUS:
        return prose_corpus(), PROSE_CORPUS
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


@dataclass(frozen=True)
class Window:
    """One training example: the part to compress, what follows the nuggets uncompressed, and the target.

    The decoder reads [nuggets; soft token; ``prompt``; ``target``] and is scored on ``target`` alone."""

    compressed: list[int]
    prompt: list[int]
    target: list[int]
    kept_whole: int = 0  # the compressed part's first tokens kept as they are (as --model nugget keeps an opening)


class Framing:
    """How a window is laid out for the model, as it will be used.

    With a chat template (``TrainingSettings.chat``) the compressed part is what a user turn holds before its
    last blank line (the template's opening included, as in decodebench's squad and cnndm prompts, where the
    nugget model compresses exactly that), the uncompressed prompt is an instruction and the template's closing,
    and the target is the assistant's reply, ended by the template's end-of-turn token. Without one, the text
    runs on plainly: an instruction on its own line after the compressed part, only when autoencoding windows
    need telling apart from continuing ones."""

    def __init__(self, tokenizer, settings: TrainingSettings):
        self.tokenize = lambda text: tokenizer(text, add_special_tokens=False).input_ids
        self.instructions = {True: self.tokenize(AUTOENCODE), False: self.tokenize(CONTINUE)}
        parts = chat_template_parts(tokenizer)
        if settings.chat and parts:
            opening, closing = parts
            self.opening, self.separator, self.closing = map(self.tokenize, (opening, "\n\n", closing))
            self.end = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        else:
            self.opening, self.separator, self.closing, self.end = [], [], self.tokenize("\n"), []
        self.instructed = bool(self.opening) or settings.autoencode > 0

    def window(self, part: list[int], continuation: list[int], autoencode: bool) -> Window:
        prompt = self.instructions[autoencode] + self.closing if self.instructed else []
        target = (part if autoencode else continuation) + self.end
        return Window(self.opening + part + self.separator, prompt, target)


class Windows:
    """Random training windows from tokenized documents: a part to compress and what the model is to produce from
    its nuggets, the part itself (autoencoding, a share ``autoencode`` of the windows) or its continuation.

    Documents too short for a window are joined to the ones after them (a dictionary's entries run on), so a
    corpus of short entries still gives windows of every length."""

    def __init__(self, tokenizer, documents: list[str], settings: TrainingSettings):
        self.settings = settings
        self.framing = Framing(tokenizer, settings)
        minimum = int(2 * settings.ratio) + settings.continuation
        joined, current = [], []
        for ids in (tokenizer(d, add_special_tokens=False).input_ids for d in documents):
            current = current + self.framing.tokenize("\n\n") + ids if current else ids
            if len(current) >= settings.context + settings.continuation:
                joined.append(current)
                current = []
        self.documents = [ids for ids in (*joined, current) if len(ids) >= minimum]
        if not self.documents:
            raise ValueError(f"no document has the {minimum} tokens a training window needs")

    def sample(self, rng: random.Random) -> Window:
        s = self.settings
        tokens = rng.choice(self.documents)
        longest = min(s.context, len(tokens) - s.continuation)
        n = rng.randint(min(longest, max(int(2 * s.ratio), s.context // 4)), longest)
        start = rng.randint(0, len(tokens) - n - s.continuation)
        part = tokens[start : start + n]
        continuation = tokens[start + n : start + n + s.continuation]
        return self.framing.window(part, continuation, autoencode=rng.random() < s.autoencode)


class DocumentWindows:
    """The authors' layout (the text-continuation windows of their Dodo training code): one document per window,
    nothing joined. The compressed part is the tokenizer's BOS, kept whole as ``--model nugget`` keeps a prompt's
    opening, then the document's opening with a "." appended unless it ends in punctuation (their fake EOS: the last
    token, which is always kept, then ends a text, as a document's last token does at test time); the target is the
    document's last ``continuation`` tokens, or the second half of a document shorter than twice that. A document is
    read up to ``context + continuation`` tokens; one shorter than ``4 * ratio`` is left out."""

    def __init__(self, tokenizer, documents: list[str], settings: TrainingSettings):
        self.settings = settings
        tokenize = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
        self.opening = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        self.punctuation = {tokenize(mark)[-1] for mark in string.punctuation}
        self.fake_eos = tokenize(".")[-1]
        longest, shortest = settings.context + settings.continuation, math.ceil(4 * settings.ratio)
        tokenized = (tokenize(d)[:longest] for d in documents)
        self.documents = [ids for ids in tokenized if len(ids) >= shortest]
        if not self.documents:
            raise ValueError(f"no document has the {shortest} tokens a training window needs")

    def window(self, tokens: list[int]) -> Window:
        c = self.settings.continuation
        target = c if len(tokens) > 2 * c else len(tokens) // 2
        part = tokens[:-target]
        if part[-1] not in self.punctuation:
            part = [*part, self.fake_eos]
        return Window(self.opening + part, [], tokens[-target:], kept_whole=len(self.opening))

    def sample(self, rng: random.Random) -> Window:
        return self.window(rng.choice(self.documents))


def training_windows(tokenizer, documents: list[str], settings: TrainingSettings) -> Windows | DocumentWindows:
    """The windows ``settings.windows`` names: "joined" (Windows) or "document" (DocumentWindows)."""
    return (DocumentWindows if settings.windows == "document" else Windows)(tokenizer, documents, settings)


def held_out_windows(tokenizer, held_docs: list[str], settings: TrainingSettings, count: int) -> list[Window]:
    """The held-out windows training reports its loss on (a fixed draw: the first ``count`` are
    always the same for the same documents and settings)."""
    windows, rng = training_windows(tokenizer, held_docs, settings), random.Random(settings.seed + 1)
    return [windows.sample(rng) for _ in range(count)]


# -- the objective ---------------------------------------------------------------------------
def mixed_precision(device: torch.device) -> bool:
    """Whether training autocasts to bfloat16 on ``device`` (bfloat16 matrix products, float32 weights and loss), as
    the paper trains: on a GPU with bfloat16, and on a CPU with bfloat16 instructions (AVX-512 BF16, AMX). Elsewhere
    bfloat16 is emulated: on 2 AVX2 cores (studies/nugget_batch_bench.py --bfloat16, 2026-11-27) a window under
    autocast ran at 0.07x [0.04, 0.12] float32's speed (12.0 s against 0.83 s)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def compression_losses(
    model,
    scorer: NuggetScorer,
    adapters: NuggetAdapters,
    windows: list[Window],
    ratio: float,
    autocast: bool | None = None,
) -> torch.Tensor:
    """Each window's mean negative log-likelihood [B] of its target given the nuggets of its compressed part and its
    uncompressed prompt (eqs. 12-18), the windows stepped together in one forward pass of each kind; in mixed
    precision where the device has bfloat16 (``autocast=None``: ``mixed_precision``)."""
    device = next(model.parameters()).device
    enabled = mixed_precision(device) if autocast is None else autocast
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled):
        return _compression_losses(model, scorer, adapters, windows, ratio, device)


def compression_loss(
    model, scorer: NuggetScorer, adapters: NuggetAdapters, window: Window, ratio: float, autocast: bool | None = None
) -> torch.Tensor:
    """One window's loss (``compression_losses`` of a batch of one)."""
    return compression_losses(model, scorer, adapters, [window], ratio, autocast)[0]


def right_padded(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows [B, longest] padded on the right with token 0 (causal attention keeps a row's real tokens from
    seeing what follows them), and their lengths [B]."""
    lengths = torch.tensor([len(row) for row in rows], device=device)
    padded = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        padded[i, : len(row)] = torch.tensor(row, device=device)
    return padded, lengths


def _compression_losses(model, scorer, adapters, windows: list[Window], ratio, device) -> torch.Tensor:
    documents, lengths = right_padded([window.compressed for window in windows], device)
    present = (torch.arange(documents.shape[1], device=device)[None] < lengths[:, None]).long()
    scores = scorer.score_batch(model, documents, present)  # [B, n]
    kept_whole = torch.tensor([window.kept_whole for window in windows], device=device)
    nuggets = encode_nuggets(model, documents, scores, ratio, encoder=True, kept_whole=kept_whole, lengths=lengths)
    adapters.use("decoder", trainable=torch.is_grad_enabled())
    read, _ = right_padded([window.prompt + window.target for window in windows], device)
    embedded = model.get_input_embeddings()(read)
    soft = adapters.soft_token.to(embedded.dtype).expand(len(windows), 1, -1)
    embeds = torch.cat([soft, embedded], dim=1)  # [B, 1 + t, d]: the soft token, then what the nuggets precede
    length = embeds.shape[1]
    mask = nugget_attention_mask(
        scores.gather(1, nuggets.indices), length, _compute_dtype(model, device), nugget_mask=nuggets.mask
    )
    logits = model(
        inputs_embeds=embeds,
        past_key_values=nuggets.cache,
        attention_mask=mask,
        position_ids=lengths[:, None] + torch.arange(length, device=device)[None],
    ).logits
    # the soft token predicts the prompt's first token, each token the next; only the targets' are scored
    labels = torch.full((len(windows), length), -100, dtype=torch.long, device=device)
    for i, window in enumerate(windows):
        first = len(window.prompt)
        labels[i, first : first + len(window.target)] = read[i, first : first + len(window.target)]
    token_losses = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none")
    return token_losses.sum(dim=1) / (labels != -100).sum(dim=1)


def _compute_dtype(model, device) -> torch.dtype:
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return model.get_input_embeddings().weight.dtype


def in_batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def backward_step(
    model, scorer, adapters, windows: list[Window], ratio: float, micro_batch: int, autocast: bool | None = None
) -> float:
    """One step's gradients: the mean of ``windows``' losses, backpropagated ``micro_batch`` windows at a time,
    windows of like length together (less padding; the sum of gradients is the same in any order); returns that
    mean."""
    loss = 0.0
    by_length = sorted(windows, key=lambda window: len(window.compressed))
    for batch in in_batches(by_length, micro_batch):
        batch_loss = compression_losses(model, scorer, adapters, batch, ratio, autocast).sum() / len(windows)
        batch_loss.backward()
        loss += batch_loss.item()
    return loss


@torch.no_grad()
def held_out_loss(model, scorer, adapters, windows: list[Window], ratio: float, micro_batch: int = 1) -> float:
    training = model.training
    model.eval()  # no adapter dropout
    try:
        losses = [
            float(loss)
            for batch in in_batches(windows, micro_batch)
            for loss in compression_losses(model, scorer, adapters, batch, ratio)
        ]
    finally:
        model.train(training)
    return sum(losses) / len(losses)


# -- training ----------------------------------------------------------------------------------
def default_checkpoint(model_name: str, ratio: float | None) -> Path:
    """Where ``train-nugget`` saves by default (the shipped compressors are in models/nugget/weights/); ``ratio``
    None: an answer-span scorer, one for every ratio."""
    from decodebench.data.paths import home

    return home() / "nugget" / f"{model_name}-{f'r{ratio:g}' if ratio else 'answer-spans'}.safetensors"


def _learning_rate(step: int, settings: TrainingSettings) -> float:
    """Linear warm-up, then cosine to zero (the paper's schedule, shortened)."""
    warmup = max(1, int(settings.warmup * settings.steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, settings.steps - warmup)
    return 0.5 * (1 + math.cos(math.pi * progress))


def training_device(name: str | None = None) -> torch.device:
    """The device train-nugget runs on: ``name`` (cpu, cuda or cuda:N), by default the first CUDA device where torch
    sees one, else the CPU. A device this machine lacks is an error that names what it has, before anything loads."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"device={name!r}: allowed: cpu, cuda, cuda:N")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={name}: torch {torch.__version__} sees no CUDA device here; allowed: cpu")
        if device.index is not None and device.index >= count:
            raise ValueError(f"device={name}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device


def frozen_model_and_scorer(model_path: str, settings: TrainingSettings, device: torch.device):
    """(tokenizer, model, scorer): the frozen model in float32 on ``device`` and a fresh scorer over its layer
    ``settings.layer`` (what both objectives train: the paper's, and the answer-span scorer's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if not 0 <= settings.layer <= model.config.num_hidden_layers:
        raise ValueError(f"layer must be in 0..{model.config.num_hidden_layers}, got {settings.layer}")
    scorer = NuggetScorer(model.config.hidden_size, settings.layer, settings.feature_norm).to(device)
    return tokenizer, model, scorer


def trainable_parts(model_path: str, settings: TrainingSettings, device: torch.device):
    """(tokenizer, model, scorer, adapters): ``frozen_model_and_scorer`` and fresh adapters (``settings``' targets and
    dropout) with the soft token."""
    tokenizer, model, scorer = frozen_model_and_scorer(model_path, settings, device)
    missing = missing_modules(model, settings.adapter_targets())
    if missing:
        raise ValueError(f"lora_targets: this model has no {missing} (its projections: {projections(model)})")
    # peft puts each adapter on its base layer's device; the soft token starts from the (moved) embeddings
    adapters = NuggetAdapters(model, settings.rank, targets=settings.adapter_targets(), dropout=settings.lora_dropout)
    return tokenizer, model, scorer, adapters


def train(
    model_path: str,
    out: str | Path,
    settings: TrainingSettings | None = None,
    corpus: str | None = None,
    model_name: str | None = None,
    log: Callable[[str], None] = print,
    progress: bool = True,
    command: str = "decodebench train-nugget (from Python)",
    device: str | None = None,
    micro_batch: int = MICRO_BATCH,
) -> Path:
    """Train (or resume training) on ``device`` (``training_device``) and save the checkpoint at ``out`` with its
    manifest beside it (models/nugget/shipped.py: ``command``, the corpus split, the losses, the revision, the
    sha256, the machine and device); returns its path. A step's ``settings.accumulate`` windows go through the model
    ``micro_batch`` at a time (padded into one forward pass: the same loss and gradients as one at a time, up to
    rounding, in fewer and larger passes)."""
    from tqdm import tqdm

    from decodebench.models.nugget.shipped import git_revision, write_manifest

    revision = git_revision()  # the code this run starts from: the checkout may change while it trains

    settings = settings or TrainingSettings()
    settings.check()
    check_micro_batch(micro_batch)
    device = training_device(device)
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
    tokenizer, model, scorer, adapters = trainable_parts(model_path, settings, device)
    lora = [*adapters.parameters("encoder"), *adapters.parameters("decoder")]
    others = [*scorer.parameters(), adapters.soft_token]
    trained = [*others, *lora]
    # AdamW (with no weight decay, Adam's update); the authors give the adapters a learning rate of their own
    groups = [{"params": others}, {"params": lora, "lr": settings.lora_lr or settings.lr}]
    optimizer = torch.optim.AdamW(
        groups, lr=settings.lr, betas=(0.9, 0.95), eps=1e-5, weight_decay=settings.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _learning_rate(step, settings))
    # the adapters' dropout acts in training mode (as any dropout of the model's own would: Llama models have none)
    model.train(settings.lora_dropout > 0)

    rng = random.Random(settings.seed)
    train_windows = training_windows(tokenizer, training_docs, settings)
    held_windows = held_out_windows(tokenizer, held_docs, settings, settings.held_out_windows)
    record = {
        "settings": asdict(settings),
        "corpus": corpus_name,
        "dropped_documents": dropped,
        "losses": [],
        "held_out": [],
    }
    start = 0
    parts = {"scorer": scorer, "adapters": adapters, "optimizer": optimizer, "schedule": schedule}
    if resume_path.is_file():
        start = load_resume(resume_path, parts, rng, record)
        log(f"resuming from step {start} ({resume_path})")
    else:
        held = held_out_loss(model, scorer, adapters, held_windows, settings.ratio, micro_batch)
        record["held_out"].append([0, held])
        log(f"held-out loss before training: {record['held_out'][0][1]:.3f}")

    # how this run stepped its windows (a resume may step them otherwise)
    record["micro_batch"], record["precision"] = (
        micro_batch,
        "bfloat16 autocast" if mixed_precision(device) else "float32",
    )
    bar = tqdm(total=settings.steps, initial=start, desc="train-nugget", disable=not progress)
    started = time.perf_counter()
    for step in range(start, settings.steps):
        optimizer.zero_grad()
        windows = [train_windows.sample(rng) for _ in range(settings.accumulate)]
        loss = backward_step(model, scorer, adapters, windows, settings.ratio, micro_batch)
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        schedule.step()
        record["losses"].append(loss)
        bar.update(1)
        bar.set_postfix(loss=f"{sum(record['losses'][-20:]) / len(record['losses'][-20:]):.3f}")
        done = step + 1
        if done % settings.eval_every == 0 or done == settings.steps:
            held = held_out_loss(model, scorer, adapters, held_windows, settings.ratio, micro_batch)
            record["held_out"].append([done, held])
            log(f"step {done}: held-out loss {held:.3f}")
        if done % settings.save_every == 0 or done == settings.steps:
            save_resume(resume_path, done, parts, rng, record)
    bar.close()
    record["seconds_this_run"] = time.perf_counter() - started
    kept = ("settings", "corpus", "dropped_documents", "held_out", "seconds_this_run", "micro_batch", "precision")
    training = {key: record[key] for key in kept}
    training["steps_done"] = settings.steps
    path = save_checkpoint(out, scorer, adapters, model_identity(model, tokenizer), settings.ratio, training)
    (out.with_name(out.name + ".log.json")).write_text(json.dumps(record, indent=1))
    corpus_split = corpus_record(documents, training_docs, held_docs, dropped)
    write_manifest(path, command, corpus_split, torch.get_num_threads(), revision, device=str(device))
    first, last = record["held_out"][0][1], record["held_out"][-1][1]
    log(
        f"saved {path}: held-out loss {first:.3f} -> {last:.3f} "
        f"(perplexity {math.exp(first):.1f} -> {math.exp(last):.1f})"
    )
    return path


def save_resume(path: Path, step: int, parts: dict, rng, record: dict) -> None:
    """The resume file: each of ``parts``' state (the scorer, adapters, optimizer, schedule), the random generators and
    the training record so far, written atomically."""
    state = {
        "step": step,
        **{name: part.state_dict() for name, part in parts.items()},
        "rng": json.dumps(rng.getstate()),
        "torch_rng": torch.get_rng_state(),
        # the adapters' dropout draws on the device's generator
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "record": json.dumps(record),
    }
    partial = path.with_name(f".{path.name}.partial")
    torch.save(state, partial)
    os.replace(partial, path)


def load_resume(path: Path, parts: dict, rng, record: dict) -> int:
    """Restore ``parts``, the generators and ``record`` from a resume file of a run with the same settings (those
    the run records, ``record["settings"]``) and objective (``record["objective"]``); returns the step it had
    reached."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain values only
        saved = json.loads(state["record"])
    except Exception as exc:  # a cut or foreign file: torch says only what failed inside it
        raise ValueError(
            f"the resume file {path} cannot be read ({type(exc).__name__}: {str(exc)[:200]}); it is cut or not one "
            "of train-nugget's: delete it to start over, or give another --out"
        ) from None
    if saved.get("objective") != record.get("objective"):
        raise ValueError(
            f"{path} was made by a run training another objective ({saved.get('objective') or 'the paper'}'s); "
            "give another --out"
        )
    if saved["settings"] != record["settings"]:
        now = record["settings"]
        changed = {
            k: (saved["settings"].get(k), now.get(k))
            for k in sorted({*saved["settings"], *now})
            if saved["settings"].get(k) != now.get(k)
        }
        raise ValueError(
            f"{path} was made with other settings {changed} (saved, now); rerun with the same settings to resume, "
            "or give another --out"
        )
    for name, part in parts.items():
        part.load_state_dict(state[name])
    version, internal, gauss = json.loads(state["rng"])
    rng.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    record.update(saved)
    return int(state["step"])
