"""A tokenizer's identity: what decides whether token ids written with one mean the same under another (an
infini-gram index, a nugget checkpoint, a vLLM draft model), whatever path or name it was loaded from."""

from __future__ import annotations

import hashlib
import json


def tokenizer_fingerprint(tokenizer) -> str:
    """The first 16 hex digits of the sha256 of the vocabulary, token by token in id order."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]
