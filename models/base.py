"""What a decodebench method is, and what every backend shares.

A *method* (``Method``) is a small class: its name on the command line, a label that says what it
is, its typed configuration (``models/config.py``), the backends it runs on, and hooks that the
backends call. A *backend* (``models/hf.py`` over lm-eval's ``HFLM``, ``models/vllm.py`` over its
``VLLM``) resolves ``pretrained`` (default: the embedded model), loads the model, measures every
``generate_until`` request, and asks its method what to do; it never names a method.

``lm_eval --model lz --model_args backend=vllm,strength=0.2`` therefore builds
``VLLMBackend(method=LZ(LZConfig(strength=0.2)))``: ``Method.create`` checks the backend and the
method's arguments before anything loads, and hands the rest to the backend.

Hooks (all optional; the defaults are plain decoding):

- ``setup(lm)``: once the model is loaded (drafts, selectors, generators);
- transformers: ``hf_generate_kwargs(lm, input_ids, attention_mask, kwargs)`` adjusts
  ``model.generate``'s keyword arguments (logits processors), or ``hf_decode(...)`` replaces the
  decoding of a batch altogether; ``hf_score(...)`` computes per-row statistics after decoding,
  outside the timed window;
- vLLM: ``vllm_logits_processors()`` names engine logits processor classes, and
  ``vllm_sampling_kwargs(kwargs)`` adjusts each request's ``SamplingParams``;
- results: ``summarize(records)`` aggregates per-request statistics of one task, and
  ``summary_columns(stats)`` says what a leaderboard shows of them.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from decodebench.models.config import MethodConfig

if TYPE_CHECKING:
    from decodebench.measure import RequestRecord

log = logging.getLogger(__name__)

# The backends, imported only when asked for (vLLM may not be installed).
BACKENDS = {
    "hf": "decodebench.models.hf:HFBackend",
    "vllm": "decodebench.models.vllm:VLLMBackend",
}


def load_backend(name: str) -> type:
    module, _, attr = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


class Method:
    """One decoding method; subclasses set the class attributes and override the hooks they need."""

    name: ClassVar[str] = ""  # --model NAME
    label: ClassVar[str] = ""  # what it is: the paper's method, a variant, a peer
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    backends: ClassVar[tuple[str, ...]] = ("hf",)
    # Sampling settings a sampling task that sets none of its own gets (the paper's, when it says)
    sampling_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, config: MethodConfig | None = None):
        self.config = config if config is not None else self.Config.defaults()

    # -- construction (what lm-eval calls through the registry) ---------------------------
    @classmethod
    def create(cls, model_args: dict[str, Any], additional_config: dict | None = None):
        """The backend model for ``model_args``, every argument checked before anything loads.

        Unlike lm-eval's default, a key given in ``--model_args`` wins over the CLI's own
        ``--batch_size``/``--device`` instead of failing with a duplicate keyword.
        """
        args = dict(model_args)
        backend = args.pop("backend", "hf")
        if backend not in cls.backends:
            raise ValueError(
                f"backend={backend!r} is not available for --model {cls.name}; allowed: {', '.join(cls.backends)}"
            )
        config, rest = cls.Config.parse(args)
        backend_class = load_backend(backend)
        allowed = set(backend_class.accepted_args())
        unknown = sorted(k for k in rest if k not in allowed)
        if unknown:
            raise ValueError(
                f"Unknown model argument(s) for --model {cls.name} with backend={backend}: {', '.join(unknown)}.\n"
                f"  Method arguments: {cls.Config.describe()}.\n"
                f"  Backend: backend ({', '.join(cls.backends)}).\n"
                f"  {backend} arguments: {', '.join(sorted(allowed))}."
            )
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in rest}
        return backend_class(method=cls(config), **rest, **extra)

    @property
    def description(self) -> str:
        """What ran, for results and reports (a method whose label depends on its arguments overrides it)."""
        return self.label

    # -- hooks ------------------------------------------------------------------------------
    def setup(self, lm) -> None:
        """Called once the backend has loaded the model."""

    def hf_generate_kwargs(self, lm, input_ids, attention_mask, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments of ``model.generate`` for one batch (unchanged by default)."""
        return kwargs

    def hf_decode(self, lm, input_ids, attention_mask, *, stop: list[str], max_new_tokens: int, kwargs: dict):
        """Decode one left-padded batch; by default ``model.generate`` as lm-eval's HFLM calls it."""
        return lm.generate_batch(
            input_ids,
            attention_mask,
            stop=stop,
            max_new_tokens=max_new_tokens,
            kwargs=self.hf_generate_kwargs(lm, input_ids, attention_mask, dict(kwargs)),
        )

    def hf_score(self, lm, input_ids, attention_mask, rows: list[list[int]]) -> list[dict[str, Any]] | None:
        """Per-row statistics computed after decoding, outside the timed window (none by default)."""
        return None

    def vllm_logits_processors(self) -> list[type]:
        """vLLM logits processor classes to load into the engine (none by default)."""
        return []

    def vllm_sampling_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A request's ``SamplingParams`` keyword arguments for this method (unchanged by default)."""
        return kwargs

    def summarize(self, records: list[RequestRecord]) -> dict[str, Any]:
        """Aggregate the per-request ``method_stats`` of one task (default: sum the numeric counters)."""
        from decodebench.measure import sum_numeric_stats

        return sum_numeric_stats(records)

    def summary_columns(self, stats: dict[str, Any]) -> dict[str, float | str]:
        """What a leaderboard shows of a task's method statistics (nothing by default)."""
        return {}


def resolve_pretrained(pretrained: Any) -> tuple[Any, bool]:
    """``pretrained`` as given, or the embedded model's checkpoint when it is omitted.

    Returns the value to load and whether it is the embedded model.
    """
    if pretrained is None or pretrained in ("", "embedded"):
        from decodebench.embedded import ensure_embedded_model

        return str(ensure_embedded_model(log=log.info)), True
    if isinstance(pretrained, str) and not os.path.exists(os.path.expanduser(pretrained)) and _is_path(pretrained):
        raise FileNotFoundError(
            f"pretrained={pretrained!r}: no such path. Allowed: a local checkpoint folder, a hub id "
            "(name or org/name) in the local cache, or nothing (or 'embedded') for the embedded model"
        )
    return pretrained, False


def _is_path(name: str) -> bool:
    """A name that can only be a file system path (a hub id is ``name`` or ``org/name``)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


class DecodeBenchLM:
    """Backend-independent part of every backend (a mixin placed before HFLM/VLLM)."""

    backend_name: ClassVar[str] = ""  # "hf" or "vllm" (not `backend`: HFLM uses that for causal/seq2seq)
    method: Method

    @classmethod
    def accepted_args(cls) -> Sequence[str]:
        """Model arguments the backend itself accepts."""
        return ()

    def init_measurement(self, meter, synchronize=None, memory=None) -> None:
        from decodebench.measure import Recorder

        self.decodebench_recorder = Recorder(
            meter,
            synchronize=synchronize,
            summarize_method_stats=self.method.summarize,
            summary_columns=self.method.summary_columns,
            memory=memory,
        )

    def decodebench_info(self, pretrained: str, embedded: bool, device: str) -> dict[str, Any]:
        from decodebench import __version__
        from decodebench.measure.machine import describe

        recorder = self.decodebench_recorder
        return {
            "version": __version__,
            "method": self.method.name,
            "method_label": self.method.description,
            "backend": self.backend_name,
            "method_args": self.method.config.as_dict(),
            "pretrained": pretrained,
            "embedded_model": embedded,
            "machine": describe(device),
            "energy": recorder.energy_status(),
            "memory": recorder.memory_status(),
            "tasks": recorder.task_summaries(),
        }


def group_by_task(requests) -> list[tuple[str, list[int]]]:
    """Positions of the requests of each task, tasks in first-seen order.

    lm-eval sends the requests of all tasks in one call; measuring task by task keeps every
    window (and so every speed and energy figure) attributable to one task.
    """
    groups: dict[str, list[int]] = {}
    for position, request in enumerate(requests):
        groups.setdefault(request.task_name, []).append(position)
    return list(groups.items())


def check_requests(requests) -> None:
    """Every request's generation settings, checked before the first one runs (no run is lost midway)."""
    import json

    from decodebench.models.generation import check_generation_kwargs

    seen = set()
    for request in requests:
        gen_kwargs = request.args[1]
        key = json.dumps(gen_kwargs, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            check_generation_kwargs(gen_kwargs, f"task {request.task_name} generation_kwargs")


def check_complete(results: list[str | None]) -> list[str]:
    """Every request must have its answer: a gap would be scored as if the model had failed."""
    missing = [i for i, text in enumerate(results) if text is None]
    if missing:
        raise RuntimeError(f"no generation for {len(missing)} request(s) (positions {missing[:10]}...)")
    return results
