"""How ``decodebench train-nugget`` trains (training.py), in a module that imports nothing heavy,
so that the command line can show the defaults without loading torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

# the paper's: the scorer reads layer 3 (appendix B.3), the adapters have rank 32 (appendix B)
SCORER_LAYER = 3
LORA_RANK = 32
WINDOWS = ("joined", "document")
# windows per forward pass (how a step's ``accumulate`` windows go through the model, not what it learns):
# `python studies/nugget_batch_bench.py` (the authors' windows, 8 a step, 6 rounds, 2 AVX2 cores, 2026-11-27): 4 at a
# time 1.23x [1.11, 1.37] one at a time's speed, 8 at a time 0.86x [0.75, 0.99] (padding costs a CPU more than the
# passes it saves); on a GPU larger batches pay: measure them there with --device cuda --micro-batch 8,32
MICRO_BATCH = 4


def check_micro_batch(micro_batch: int) -> None:
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch (windows per forward pass) must be an integer >= 1, got {micro_batch!r}")


# What the authors' code does where the paper is silent (their nugget library and Dodo training code; notes in
# training.py): `decodebench train-nugget --recipe authors`. The defaults stay the shipped checkpoints' settings.
AUTHORS_RECIPE = {
    "windows": "document",  # one document per window: BOS, the part to compress, a "." unless it ends in punctuation
    "lora_targets": "q_proj,v_proj,o_proj",
    "lora_dropout": 0.1,
    "feature_norm": True,  # the scorer reads layer 3's states through the model's final RMSNorm
    "weight_decay": 0.1,  # AdamW
    "accumulate": 32,  # windows per optimizer step
}

# `decodebench train-nugget --recipe answer-spans` (span_training.py; ours, issue 35): the scorer alone, a dense loss
# toward the spans questions ask for, 16 entries a step; the authors' feature norm and weight decay; layer 12 of 30,
# not the paper's 3: whether a word is what a question asks for depends on its context more than on its spelling
ANSWER_SPANS_RECIPE = {
    "layer": 12,
    "steps": 800,
    "accumulate": 16,
    "lr": 1e-3,
    "weight_decay": 0.1,
    "feature_norm": True,
}


@dataclass(frozen=True)
class TrainingSettings:
    ratio: float = 10.0
    steps: int = 3000  # the shipped checkpoints' (models/nugget/weights/)
    context: int = 256  # longest compressed part (the paper: 512)
    continuation: int = 64  # continued part (the paper: up to 128)
    lr: float = 5e-4
    # share of windows whose target is the compressed part itself (the paper's autoencoding, section 4); the rest
    # continue it (its zero-shot setting, section 6). Mixing it in lost to continuation alone in short trials on
    # held-out SQuAD questions, as did windows laid out in the model's chat template (``chat``): training.py
    autoencode: float = 0.0
    chat: bool = False
    warmup: float = 0.05  # share of the steps
    rank: int = LORA_RANK
    layer: int = SCORER_LAYER
    # Added after the shipped runs, each defaulting to what they did (AUTHORS_RECIPE: the authors' values):
    windows: str = "joined"  # "joined": short documents run on into windows cut at random; "document": one each
    lora_targets: str = "q_proj,k_proj,v_proj"  # the projections both adapters wrap
    lora_dropout: float = 0.0  # dropout on the adapters' input while training
    feature_norm: bool = False  # the scorer's features through the model's final norm
    weight_decay: float = 0.0  # AdamW's decoupled weight decay (0: Adam's update)
    lora_lr: float | None = None  # the adapters' peak learning rate (None: lr, as the scorer's and soft token's)
    accumulate: int = 1  # windows per optimizer step (their gradients summed, the loss their mean)
    seed: int = 0
    held_out_windows: int = 24
    eval_every: int = 250
    save_every: int = 25

    def check(self) -> None:
        if not (math.isfinite(self.ratio) and self.ratio > 1):
            raise ValueError(f"ratio must be a finite number > 1, got {self.ratio}")
        for name in ("steps", "context", "continuation", "rank", "held_out_windows", "eval_every", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.context < 2 * self.ratio:
            raise ValueError(f"context={self.context} leaves nothing to compress at ratio {self.ratio}")
        if not (math.isfinite(self.autoencode) and 0 <= self.autoencode <= 1):
            raise ValueError(f"autoencode must be a share in [0, 1], got {self.autoencode}")
        for name in ("lr", "lora_lr"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if self.windows not in WINDOWS:
            raise ValueError(f"windows must be one of {', '.join(WINDOWS)}, got {self.windows!r}")
        if not self.adapter_targets() or not all(t.isidentifier() for t in self.adapter_targets()):
            raise ValueError(f"lora_targets must be module names separated by commas, got {self.lora_targets!r}")
        if not (math.isfinite(self.lora_dropout) and 0 <= self.lora_dropout < 1):
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if self.accumulate < 1:
            raise ValueError(f"accumulate must be >= 1, got {self.accumulate}")

    def adapter_targets(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.lora_targets.split(",") if name.strip())
