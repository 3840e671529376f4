"""The KV cache vLLM's CPU build is given when nothing says how much, in a module of its own: ``decodebench serve``
sizes it before it starts ``vllm serve``, and importing the vLLM backend (lm-eval's vLLM model, vLLM's ``LLM``) for
it cost seconds of CPU at every server start."""

from __future__ import annotations

import contextlib

# KV cache of the CPU build when nothing says how much: room for this many sequences of max_model_len tokens,
# at most this share of the memory available, at least one sequence
CPU_KV_SEQUENCES = 16
CPU_KV_SHARE = 0.25


def cpu_kv_cache_bytes(model: str, max_model_len: int | None = None) -> int:
    """What vLLM's CPU build reserves for the KV cache by default here, sized from the model's config.

    vLLM reads ``gpu_memory_utilization`` (0.9 by default, lm-eval's too) as the share of the whole NUMA node's
    memory to reserve on the CPU, which fails at start on a machine whose node is partly used (every machine of
    this project); an explicit size (``kv_cache_memory_bytes``) is what its CPU worker takes instead.
    """
    import psutil

    text = _text_config(model)
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    kv_heads = text.get("num_key_value_heads") or heads
    per_token = 2 * text["num_hidden_layers"] * kv_heads * head_dim * 4  # keys and values, up to 4 bytes each
    length = int(max_model_len or text.get("max_position_embeddings") or 4096)
    available = psutil.virtual_memory().available
    wanted = min(per_token * length * CPU_KV_SEQUENCES, int(available * CPU_KV_SHARE))
    if wanted < per_token * length:
        raise ValueError(
            f"one sequence of max_model_len={length} needs {per_token * length / 2**30:.1f} GiB of KV cache, more than "
            f"{CPU_KV_SHARE:.0%} of the {available / 2**30:.1f} GiB available: lower max_model_len, or give "
            "kv_cache_memory_bytes"
        )
    return wanted


# what sizes the KV cache; a config.json that names every one of them gives the values transformers would
SIZING_FIELDS = (
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "max_position_embeddings",
)


def _text_config(model: str) -> dict:
    """The language model's configuration fields that size its KV cache (``SIZING_FIELDS``, and ``hidden_size``).
    A local checkpoint whose config.json gives every one of them (the embedded model's does) is read as JSON:
    importing transformers costs seconds of CPU in ``decodebench serve``, which only starts ``vllm serve``. Any other
    (a hub id, a config whose fields transformers renames or fills with an architecture's default) is read through
    transformers' ``AutoConfig``."""
    import json
    from pathlib import Path

    with contextlib.suppress(OSError, ValueError, AttributeError):
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
        text = config.get("text_config", config)
        if all(isinstance(text.get(field), int) for field in SIZING_FIELDS):
            return text
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    text = getattr(config, "text_config", config)
    return {field: getattr(text, field, None) for field in (*SIZING_FIELDS, "hidden_size")}
