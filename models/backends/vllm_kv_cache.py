"""The KV cache vLLM's CPU build is given when nothing says how much, in a module of its own: ``decodebench serve``
sizes it before it starts ``vllm serve``, and importing the vLLM backend (lm-eval's vLLM model, vLLM's ``LLM``) for
it cost seconds of CPU at every server start."""

from __future__ import annotations

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
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    text = getattr(config, "text_config", config)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    per_token = 2 * text.num_hidden_layers * kv_heads * head_dim * 4  # keys and values, up to 4 bytes each
    length = int(max_model_len or getattr(text, "max_position_embeddings", 4096))
    available = psutil.virtual_memory().available
    wanted = min(per_token * length * CPU_KV_SEQUENCES, int(available * CPU_KV_SHARE))
    if wanted < per_token * length:
        raise ValueError(
            f"one sequence of max_model_len={length} needs {per_token * length / 2**30:.1f} GiB of KV cache, more than "
            f"{CPU_KV_SHARE:.0%} of the {available / 2**30:.1f} GiB available: lower max_model_len, or give "
            "kv_cache_memory_bytes"
        )
    return wanted
