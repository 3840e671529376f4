"""What a decodebench method is: the ``Method`` contract, what its hooks return, and what they receive.

A *method* (``Method``) is a small class: its name on the command line, a label that says what it
is, its typed configuration (``models/config.py``), the backends it runs on, what the main job
runs of it (``demo_model_args``), and hooks that the backends call. A *backend* (``models/backends/``:
``hf.py`` over lm-eval's ``HFLM``, ``vllm.py`` over its ``VLLM``, ``served.py`` over its ``LocalCompletionsAPI``;
what they share, the one ``generate_until``, is in ``models/backends/base.py``, their table by name in
``models/registry.py``)
resolves ``pretrained`` (default: the embedded model), loads the
model, measures every ``generate_until`` request, and asks its method what to do; it never names
a method, and no method imports a backend: a hook receives the backend as ``lm``, and uses only
what ``DecodingModel`` (below) lists.

``lm_eval --model lz --model_args backend=vllm,strength=0.2`` therefore builds
``VLLMBackend(method=LZ(LZConfig(strength=0.2)))``: ``Method.create`` checks the backend and the
method's arguments before anything loads, and hands the rest to the backend.

Hooks (all optional; the defaults are plain decoding):

- ``setup(lm)``: once the model is loaded (drafts, selectors, generators);
- transformers: ``hf_generate_kwargs(lm, input_ids, attention_mask, kwargs)`` adjusts
  ``model.generate``'s keyword arguments (logits processors), or ``hf_decode(...)`` replaces the
  decoding of a batch altogether and returns a ``DecodeOutput``; ``hf_score(...)`` computes
  per-row statistics after decoding, outside the timed window;
- vLLM: ``vllm_engine_args(args, pretrained)`` adjusts the engine's arguments (speculative decoding),
  ``vllm_model_runner(args)`` says which of vLLM's model runners its pieces need (models/model_runners.py),
  ``vllm_logits_processors()`` names engine logits processor classes, and
  ``vllm_sampling_kwargs(kwargs)`` adjusts each request's ``SamplingParams``;
- results: ``summarize(records, engine)`` aggregates per-request statistics of one task (and the engine's
  counters over it), and
  ``summary_columns(stats)`` says what a leaderboard shows of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from decodebench.models.config import MethodConfig

if TYPE_CHECKING:
    import torch

    from decodebench.measure import RequestRecord
    from decodebench.models.model_runners import RunnerNeed


# What a backend can do, as a method asks it (``BackendLM.capabilities``): methods branch on these, never on a
# backend's name, so a new backend that can do the same needs no change to any method.
ENGINE_SPECULATES = "its engine drafts and verifies, configured by the method"  # vLLM in this process
SERVER_DECODES = "a server it does not configure decodes; requests can only ask"  # a served model


@dataclass
class DecodeOutput:
    """What ``hf_decode`` returns for one batch."""

    tokens: torch.Tensor | list[list[int]]  # new tokens per row (rows may be padded after EOS)
    first_token_at: float | None = None  # time.perf_counter() when the first new token existed
    row_stats: list[dict[str, Any]] | None = None  # per-row method statistics


class DecodingModel(Protocol):
    """What a method's hooks may use of the backend they receive as ``lm`` (the transformers backend
    offers all of it; on vLLM the hooks that receive ``lm`` are ``setup`` alone)."""

    model: torch.nn.Module  # the loaded causal LM (transformers)
    tokenizer: Any  # its tokenizer (transformers' PreTrainedTokenizer)
    device: torch.device
    pretrained_name: str  # what `pretrained` resolved to: a hub id or a local path
    capabilities: frozenset[str]  # what the backend can do (ENGINE_SPECULATES, SERVER_DECODES): ask, never its name
    eot_token_id: int

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str: ...

    def eos_ids(self) -> set[int]:
        """Every token id that ends a generation (the tokenizer's and the generation config's)."""
        ...

    def decoding_settings(self, kwargs: dict[str, Any], method_defaults: dict[str, Any]) -> dict[str, Any]:
        """How ``model.generate`` would decode with ``kwargs``: a ``decoding_record`` after every default."""
        ...

    def generate_batch(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, stop: list[str], max_new_tokens: int, kwargs
    ) -> DecodeOutput:
        """``model.generate`` on one left-padded batch, as lm-eval's HFLM calls it."""
        ...


class Method:
    """One decoding method; subclasses set the class attributes and override the hooks they need."""

    name: ClassVar[str] = ""  # --model NAME
    label: ClassVar[str] = ""  # what it is: the paper's method, a variant, a peer
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    backends: ClassVar[tuple[str, ...]] = ("hf",)
    # Sampling settings a sampling task that sets none of its own gets (the paper's, when it says)
    sampling_defaults: ClassVar[dict[str, Any]] = {}
    # The task on which the main job times this method against the baseline in interleaved rounds (a method whose
    # paper claims a speed-up at the baseline's quality names one; the main job compares the first that does)
    demo_compared_on: ClassVar[str | None] = None

    def __init__(self, config: MethodConfig | None = None):
        self.config = config if config is not None else self.Config.defaults()

    # -- construction (what lm-eval calls through the registry) ---------------------------
    @classmethod
    def create(cls, model_args: dict[str, Any], additional_config: dict | None = None):
        """The backend model for ``model_args``, every argument checked before anything loads.

        Unlike lm-eval's default, a key given in ``--model_args`` wins over the CLI's own
        ``--batch_size``/``--device`` instead of failing with a duplicate keyword.
        """
        config, backend_class, rest = cls.check_args(model_args)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in rest}
        return backend_class(method=cls(config), **rest, **extra)

    @classmethod
    def check_args(cls, model_args: dict[str, Any]) -> tuple[MethodConfig, type, dict[str, Any]]:
        """(the method's checked configuration, the backend class, the backend's arguments), or a ValueError that
        names the argument and what is allowed; nothing is loaded."""
        from decodebench.models.registry import load_backend

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
        backend_class.check_backend_args(rest)
        backend_class.check_method_args(cls(config), rest)
        return config, backend_class, rest

    @classmethod
    def demo_model_args(cls) -> dict[str, Any]:
        """The ``--model_args`` the main job (``decodebench demo``) runs this method with (its defaults)."""
        return {}

    @property
    def description(self) -> str:
        """What ran, for results and reports (a method whose label depends on its arguments overrides it)."""
        return self.label

    # -- hooks ------------------------------------------------------------------------------
    def setup(self, lm: DecodingModel) -> None:
        """Called once the backend has loaded the model."""

    def hf_generate_kwargs(
        self, lm: DecodingModel, input_ids, attention_mask, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """Keyword arguments of ``model.generate`` for one batch (unchanged by default)."""
        return kwargs

    def hf_decode(
        self, lm: DecodingModel, input_ids, attention_mask, *, stop: list[str], max_new_tokens: int, kwargs: dict
    ) -> DecodeOutput:
        """Decode one left-padded batch; by default ``model.generate`` as lm-eval's HFLM calls it."""
        return lm.generate_batch(
            input_ids,
            attention_mask,
            stop=stop,
            max_new_tokens=max_new_tokens,
            kwargs=self.hf_generate_kwargs(lm, input_ids, attention_mask, dict(kwargs)),
        )

    def hf_score(
        self, lm: DecodingModel, input_ids, attention_mask, rows: list[list[int]]
    ) -> list[dict[str, Any]] | None:
        """Per-row statistics computed after decoding, outside the timed window (none by default)."""
        return None

    def vllm_engine_args(self, args: dict[str, Any], pretrained: str) -> dict[str, Any]:
        """The vLLM engine's arguments for this method (speculative decoding's config, ...; unchanged by default)."""
        return args

    def vllm_model_runner(self, engine_args: dict[str, Any]) -> RunnerNeed | None:
        """What this method's vLLM pieces need of vLLM's model runner for an engine of these arguments (a
        ``RunnerNeed``), or None when either runner serves (vLLM chooses)."""
        return None

    def vllm_logits_processors(self) -> list[type]:
        """vLLM logits processor classes to load into the engine (none by default)."""
        return []

    def vllm_sampling_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A request's ``SamplingParams`` keyword arguments for this method (unchanged by default)."""
        return kwargs

    def summarize(self, records: list[RequestRecord], engine: dict[str, Any] | None = None) -> dict[str, Any]:
        """Aggregate the per-request ``method_stats`` of one task (default: sum the numeric counters); ``engine``
        holds what the inference engine's own counters did over the task, where it keeps them (vLLM)."""
        from decodebench.measure import sum_numeric_stats

        return sum_numeric_stats(records)

    def summary_columns(self, stats: dict[str, Any]) -> dict[str, float | str]:
        """What a leaderboard shows of a task's method statistics (nothing by default)."""
        return {}
