"""The LZ penalty's settings as a request carries them in vLLM's ``SamplingParams.extra_args``.

Plain data, no vLLM import: a served client builds them for a remote server (no engine on the client), and both
runners' processors read them back on the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from decodebench.models.lz.config import LZConfig

if TYPE_CHECKING:
    from vllm import SamplingParams

# per-request key -> LZConfig field; `lz_penalty` (the strength) switches the penalty on
EXTRA_ARGS = {
    "lz_penalty": "strength",
    "lz_window": "window",
    "lz_buffer": "buffer",
    "lz_codelength": "codelength",
    "lz_include_prompt": "include_prompt",
}


def lz_extra_args(config: LZConfig) -> dict:
    """What a request's ``SamplingParams.extra_args`` carries to switch the LZ penalty on."""
    return {key: getattr(config, field) for key, field in EXTRA_ARGS.items()}


def request_config(params: SamplingParams) -> LZConfig | None:
    """The request's LZ settings (checked like ``--model_args``), or None when it does not ask for the penalty."""
    extra = params.extra_args or {}
    settings = {key: value for key, value in extra.items() if key.startswith("lz_")}
    if not settings:
        return None
    unknown = sorted(set(settings) - set(EXTRA_ARGS))
    if unknown:
        raise ValueError(f"unknown LZ penalty settings {unknown}; allowed: {list(EXTRA_ARGS)}")
    if "lz_penalty" not in settings:
        raise ValueError(f"LZ penalty settings {sorted(settings)} without lz_penalty, which switches it on")
    config, _ = LZConfig.parse({EXTRA_ARGS[key]: value for key, value in settings.items()})
    return config
