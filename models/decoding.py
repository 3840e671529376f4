"""A task's generation settings: checked before any work, and recorded as what actually ran.

``check_generation_kwargs`` refuses settings that would otherwise be silently changed or fail
midway (lm-eval turns ``do_sample=True, temperature=0`` into a warning and transformers into an
error at the first batch; a NaN temperature samples garbage). Backends call it on every request
before the first one runs, and ``lm_eval``'s ``--gen_kwargs`` is checked before the model loads
(decodebench.lmeval.plugin).

``decoding_record`` is the form results use to say how a task was decoded: ``{"do_sample":
False}`` for greedy decoding, else the temperature and the top-k/top-p actually applied (None
where none was), after every default a backend adds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_TOKEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")


class GenerationSettingsError(ValueError):
    """A generation setting that cannot be honoured; the message says which and what is allowed."""


def check_generation_kwargs(kwargs: Mapping[str, Any], where: str) -> None:
    """Raise ``GenerationSettingsError`` for settings no backend can honour as written."""

    def fail(message: str) -> None:
        raise GenerationSettingsError(f"{where}: {message}")

    def number(key: str) -> float | None:
        value = kwargs.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                fail(f"{key}={value!r} is not a number")
        if not math.isfinite(value):
            fail(f"{key}={value!r} is not finite")
        return float(value)

    temperature = number("temperature")
    if temperature is not None and temperature < 0:
        fail(f"temperature={temperature} is negative; allowed: 0 (greedy) or more")
    top_p = number("top_p")
    if top_p is not None and not 0 < top_p <= 1:
        fail(f"top_p={top_p} is outside (0, 1]")
    top_k = number("top_k")
    if top_k is not None and (top_k != int(top_k) or top_k < -1):
        fail(f"top_k={kwargs['top_k']!r} must be a whole number >= 0 (0 or -1: no top-k)")
    for key in MAX_TOKEN_KEYS:
        value = number(key)
        if value is not None and (value != int(value) or value < 1):
            fail(f"{key}={kwargs[key]!r} must be a whole number >= 1")
    do_sample = kwargs.get("do_sample")
    if do_sample not in (None, True, False):
        fail(f"do_sample={do_sample!r} must be true or false")
    if do_sample is True and temperature == 0:
        fail("do_sample=true with temperature=0 samples nothing; set temperature > 0, or do_sample=false for greedy")
    until = kwargs.get("until")
    if until is not None and not (
        isinstance(until, str) or (isinstance(until, (list, tuple)) and all(isinstance(s, str) for s in until))
    ):
        fail(f"until={until!r} must be a string or a list of strings")


def decoding_record(
    do_sample: bool, temperature: float | None = None, top_k: int | None = None, top_p: float | None = None
) -> dict[str, Any]:
    """How a request was decoded, in one canonical form (no top-k: None; no top-p: None)."""
    if not do_sample:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": float(1.0 if temperature is None else temperature),
        "top_k": int(top_k) if top_k is not None and top_k > 0 else None,
        "top_p": float(top_p) if top_p is not None and top_p < 1 else None,
    }
