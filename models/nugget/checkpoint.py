"""A trained nugget compressor on disk: one safetensors file, checked before any generation.

The file holds the scorer (``scorer.*``), the two LoRA adapters (``encoder.*``, ``decoder.*``)
and the soft token (``soft_token``), and in its metadata the format, the identity of the model it
was trained for (sizes, vocabulary fingerprint, a probe of its embedding weights), the adapters'
settings, whether the scorer reads its features through the model's final norm (``scorer``;
absent in files written before it, which do not) and how it was trained. safetensors holds tensors
only, so reading a file can never run code; nothing here ever falls back to pickle.

``read_checkpoint`` checks the file itself (readable, ours, complete, finite) when ``--model
nugget`` parses its arguments, before the model loads; ``NuggetCheckpoint.check_model`` checks it
against the loaded model before the first request.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = "decodebench-nugget/2"
PROBE_SIZE = 64


class CheckpointError(ValueError):
    """A nugget checkpoint that cannot be used; the message says what is wrong with it."""


def model_identity(model, tokenizer) -> dict[str, Any]:
    """What a checkpoint must match: sizes, vocabulary, and a probe of the embedding weights
    (64 fixed entries, compared with a tolerance so that another dtype of the same model passes)."""
    from decodebench.data.vocabulary import tokenizer_fingerprint

    weights = model.get_input_embeddings().weight.detach().float().flatten()
    positions = torch.arange(PROBE_SIZE) * (weights.numel() - 1) // (PROBE_SIZE - 1)
    return {
        "hidden_size": int(model.config.hidden_size),
        "num_hidden_layers": int(model.config.num_hidden_layers),
        "vocabulary": tokenizer_fingerprint(tokenizer),
        "embedding_probe": [round(float(v), 6) for v in weights[positions.to(weights.device)].cpu()],
        "name": str(getattr(model.config, "_name_or_path", "") or ""),
    }


def same_model(saved: dict, actual: dict) -> bool:
    if any(saved.get(key) != actual[key] for key in ("hidden_size", "num_hidden_layers", "vocabulary")):
        return False
    probe, real = saved.get("embedding_probe") or [], actual["embedding_probe"]
    return len(probe) == len(real) and all(
        math.isclose(a, b, rel_tol=2e-2, abs_tol=2e-3) for a, b in zip(probe, real, strict=True)
    )


@dataclass
class NuggetCheckpoint:
    path: Path
    identity: dict[str, Any]
    layer: int
    ratio: float
    adapters: dict[str, Any] | None  # {"rank", "alpha", "targets"}, or None for a scorer alone
    training: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(repr=False)
    feature_norm: bool = False  # the scorer reads its layer through the model's final norm (files before: no)

    @property
    def has_adapters(self) -> bool:
        return self.adapters is not None

    def check_model(self, model, tokenizer) -> None:
        actual = model_identity(model, tokenizer)
        if not same_model(self.identity, actual):
            raise CheckpointError(
                f"{self.path} was trained for another model ({_describe(self.identity)}); the model loaded now is "
                f"{_describe(actual)}. Train one for it with `decodebench train-nugget --pretrained ...`"
            )
        if not 0 <= self.layer <= actual["num_hidden_layers"]:
            raise CheckpointError(f"{self.path}: scorer layer {self.layer} is outside this model's layers")
        if self.feature_norm:  # named before the first request, not at its scoring
            from decodebench.models.nugget.compressor import final_norm

            try:
                final_norm(model)
            except ValueError as exc:
                raise CheckpointError(f"{self.path}: {exc}") from None

    def scorer(self):
        from decodebench.models.nugget.compressor import NuggetScorer

        scorer = NuggetScorer(self.identity["hidden_size"], self.layer, self.feature_norm)
        own = {k.removeprefix("scorer."): v for k, v in self.tensors.items() if k.startswith("scorer.")}
        try:
            scorer.load_state_dict(own)
        except RuntimeError as exc:
            raise CheckpointError(f"{self.path}: the scorer's tensors do not fit ({exc})") from exc
        return scorer.eval()

    def attach_adapters(self, model):
        """The checkpoint's adapters and soft token, attached to ``model``."""
        from decodebench.models.nugget.compressor import NuggetAdapters, missing_modules, projections

        targets = list(self.adapters["targets"])
        unknown = missing_modules(model, targets)
        if unknown:
            raise CheckpointError(
                f"{self.path}: its adapters wrap {unknown}, which this model does not have (its modules include "
                f"{projections(model)})"
            )
        adapters = NuggetAdapters(model, self.adapters["rank"], self.adapters["alpha"], targets)
        wanted = adapters.state_dict()
        found = {k for k in self.tensors if not k.startswith("scorer.")}
        if set(wanted) != found:
            missing, extra = sorted(set(wanted) - found), sorted(found - set(wanted))
            raise CheckpointError(
                f"{self.path}: adapter tensors do not match this model (missing {missing[:3]}, unexpected {extra[:3]})"
            )
        for key, value in wanted.items():
            if tuple(self.tensors[key].shape) != tuple(value.shape):
                raise CheckpointError(
                    f"{self.path}: {key} has shape {tuple(self.tensors[key].shape)}, but rank {self.adapters['rank']} "
                    f"adapters on this model need {tuple(value.shape)} (a checkpoint of another rank or model)"
                )
        adapters.load_state_dict({k: v for k, v in self.tensors.items() if not k.startswith("scorer.")})
        return adapters


def _describe(identity: dict) -> str:
    """Enough to tell two models apart: the name, sizes, vocabulary and the first weights of the embedding probe."""
    name = identity.get("name") or "unnamed"
    probe = ", ".join(f"{v:.4g}" for v in (identity.get("embedding_probe") or [])[:3])
    return (
        f"{name}: hidden size {identity.get('hidden_size')}, {identity.get('num_hidden_layers')} layers, "
        f"vocabulary {identity.get('vocabulary')}, embedding weights [{probe}, ...]"
    )


def save_checkpoint(
    path: str | Path,
    scorer,
    adapters,
    identity: dict,
    ratio: float,
    training: dict,
) -> Path:
    """Write the checkpoint atomically (a reader never sees half a file), in bfloat16: half the bytes of float32,
    and the precision the paper trains its matrix products in."""
    from safetensors.torch import save_file

    state = {f"scorer.{k}": v for k, v in scorer.state_dict().items()}
    if adapters is not None:
        state.update(adapters.state_dict())
    tensors = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in state.items()}
    metadata = {
        "format": FORMAT,
        "model": json.dumps(identity),
        "layer": str(scorer.layer),
        "scorer": json.dumps({"feature_norm": bool(scorer.feature_norm)}),
        "ratio": repr(float(ratio)),
        "adapters": json.dumps(adapters.describe() if adapters is not None else None),
        "training": json.dumps(training),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    save_file(tensors, str(partial), metadata=metadata)
    os.replace(partial, path)
    return path


def training_objective(path: str | Path) -> str | None:
    """The ``objective`` a checkpoint's training record names, from its header alone (None: the paper's, or a file
    that cannot be read, which ``read_checkpoint`` then refuses by name)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return json.loads((handle.metadata() or {}).get("training", "{}")).get("objective")
    except Exception:  # any unreadable file: read_checkpoint says what is wrong with it
        return None


def read_checkpoint(path: str | Path) -> NuggetCheckpoint:
    """The checkpoint at ``path``, or a ``CheckpointError`` naming what is wrong with the file."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"selector={str(path)!r} is neither a built-in selector nor an existing checkpoint file "
            "(train one with `decodebench train-nugget`)"
        )
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a decodebench nugget checkpoint: it cannot be read as a safetensors file ({exc})"
        ) from exc
    if metadata.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is not a decodebench nugget checkpoint (format {metadata.get('format')!r}, expected {FORMAT!r}); "
            "checkpoints come from `decodebench train-nugget`"
        )
    try:
        identity = json.loads(metadata["model"])
        layer = int(metadata["layer"])
        ratio = float(metadata["ratio"])
        adapters = json.loads(metadata["adapters"])
        training = json.loads(metadata.get("training", "{}"))
        feature_norm = json.loads(metadata.get("scorer", "{}")).get("feature_norm", False)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: malformed metadata ({exc!r})") from exc
    if not isinstance(feature_norm, bool):
        raise CheckpointError(
            f"{path}: malformed metadata (scorer feature_norm {feature_norm!r}: expected true or false)"
        )
    if not isinstance(identity, dict) or not {"hidden_size", "num_hidden_layers", "vocabulary"} <= set(identity):
        raise CheckpointError(f"{path}: malformed metadata (no model identity)")
    if not any(key.startswith("scorer.") for key in tensors):
        raise CheckpointError(f"{path}: no scorer tensors")
    if adapters is not None and not ({"rank", "alpha", "targets"} <= set(adapters) and "soft_token" in tensors):
        raise CheckpointError(f"{path}: malformed metadata (adapter settings or the soft token missing)")
    if adapters is not None:
        _check_adapter_settings(path, adapters, tensors)
    bad = [key for key, value in tensors.items() if not torch.isfinite(value).all()]
    if bad:
        raise CheckpointError(f"{path}: non-finite values (NaN or inf) in {', '.join(sorted(bad)[:5])}")
    return NuggetCheckpoint(path, identity, layer, ratio, adapters, training, tensors, feature_norm)


def _check_adapter_settings(path: Path, adapters: dict, tensors: dict[str, torch.Tensor]) -> None:
    """The adapters' settings against the tensors the file holds, before any adapter is built: a rank the tensors do
    not have (10^9 would ask for terabytes) or a non-finite alpha is the file's error, named."""
    rank, alpha, targets = adapters["rank"], adapters["alpha"], adapters["targets"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise CheckpointError(f"{path}: malformed metadata (adapter rank {rank!r}: expected a whole number >= 1)")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise CheckpointError(f"{path}: malformed metadata (adapter alpha {alpha!r}: expected a finite number)")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise CheckpointError(f"{path}: malformed metadata (adapter targets {targets!r}: expected module names)")
    lora = {key: tuple(value.shape) for key, value in tensors.items() if ".lora_" in key}
    wrong = sorted(key for key, shape in lora.items() if len(shape) != 2 or rank not in shape)
    if not lora or wrong:
        raise CheckpointError(
            f"{path}: its metadata says rank {rank}, but its adapter tensors "
            + (f"include {wrong[0]} of shape {lora[wrong[0]]}" if wrong else "are missing")
        )
