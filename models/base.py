"""What every decodebench model shares, whatever its backend.

A decodebench model is two mixins over an lm-eval backend class::

    class LZ(LZMethod, HFBackend)        # registered as `lm_eval --model lz`
    class LZVLLM(LZMethod, VLLMBackend)  # what `--model lz --model_args backend=vllm` builds

- the *method* mixin declares the method's name, its ``--model_args`` (``method_args``) and the
  backends it runs on, and implements the method through the backend's hooks;
- the *backend* (``models/hf.py`` subclasses lm-eval's ``HFLM``, ``models/vllm.py`` its
  ``VLLM``) resolves ``pretrained`` (default: the embedded model), strips the method's
  arguments before lm-eval sees them, rejects unknown ones, and measures every
  ``generate_until`` request through ``decodebench.measure``.

``DecodeBenchLM`` below holds the parts that do not depend on the backend.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from decodebench import __version__
from decodebench.embedded import ensure_embedded_model
from decodebench.machine import describe
from decodebench.measure import Recorder, RequestRecord, sum_numeric_stats

log = logging.getLogger(__name__)


def resolve_pretrained(pretrained: Any) -> tuple[Any, bool]:
    """``pretrained`` as given, or the embedded model's checkpoint when it is omitted.

    Returns the value to load and whether it is the embedded model.
    """
    if pretrained is None or pretrained in ("", "embedded"):
        return str(ensure_embedded_model(log=log.info)), True
    return pretrained, False


@dataclass(frozen=True)
class Arg:
    """One method argument of ``--model_args``: its type, default, and what it means."""

    kind: type  # int, float, str or bool
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any], str | None] | None = None  # returns what is wrong, or None

    def parse(self, name: str, value: Any) -> Any:
        value = self._coerce(name, value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{name}={value!r} is not allowed; choose one of {list(self.choices)}")
        if self.check is not None and value is not None:
            problem = self.check(value)
            if problem:
                raise ValueError(f"{name}={value!r}: {problem}")
        return value

    def _coerce(self, name: str, value: Any) -> Any:
        if value is None:
            return None
        kind = self.kind
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise ValueError(f"{name} must be true or false, got {value!r}")
        if kind is int:
            if isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if isinstance(value, int):
                return value
            if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
                return int(value)
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if kind is float:
            if isinstance(value, bool):
                raise ValueError(f"{name} must be a number, got {value!r}")
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be a number, got {value!r}") from None
        return str(value)


class DecodeBenchLM:
    """Backend-independent part of every decodebench model (a mixin placed before HFLM/VLLM)."""

    method: ClassVar[str] = "baseline"
    method_args: ClassVar[dict[str, Arg]] = {}
    # "hf" or "vllm", set by the backend class (not `backend`: HFLM uses that for causal/seq2seq)
    backend_name: ClassVar[str] = ""
    # backend name -> "module:Class" implementing this method on that backend
    backends: ClassVar[dict[str, str]] = {}
    # Paper-faithful or an approximation: shown in reports next to the method.
    method_label: ClassVar[str] = ""

    decodebench_recorder: Recorder
    method_config: dict[str, Any]

    # -- construction -------------------------------------------------------------------
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None):
        """What lm-eval calls: builds the class of the requested ``backend``.

        Unlike lm-eval's default, a key given in ``--model_args`` wins over the CLI's own
        ``--batch_size``/``--device`` defaults instead of failing with a duplicate keyword.
        """
        args = dict(arg_dict)
        backend = args.pop("backend", "hf")
        impl = cls.backend_class(backend)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in args}
        return impl(**args, **extra)

    @classmethod
    def backend_class(cls, backend: str) -> type:
        if backend not in cls.backends:
            raise ValueError(
                f"backend={backend!r} is not available for --model {cls.method}; "
                f"allowed: {', '.join(sorted(cls.backends))}"
            )
        module, _, attr = cls.backends[backend].partition(":")
        return getattr(importlib.import_module(module), attr)

    @classmethod
    def backend_arg_names(cls) -> Sequence[str]:
        """Model arguments the backend itself accepts (overridden by each backend)."""
        return ()

    @classmethod
    def split_arguments(cls, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Separate the method's arguments (parsed and checked) from the backend's.

        Method arguments must never reach lm-eval's classes: HFLM forwards unknown keys to
        ``from_pretrained``, which fails far from the cause. Unknown keys fail here instead.
        """
        kwargs = dict(kwargs)
        requested_backend = kwargs.pop("backend", cls.backend_name)
        if requested_backend != cls.backend_name:
            raise ValueError(
                f"{cls.__name__} implements backend={cls.backend_name!r}, not {requested_backend!r}; "
                f"build models through {cls.__name__}.create_from_arg_obj to choose a backend"
            )
        method_values = {
            name: spec.parse(name, kwargs.pop(name, spec.default)) for name, spec in cls.method_args.items()
        }
        method_values = cls.check_method_args(method_values)
        allowed = set(cls.backend_arg_names())
        unknown = sorted(k for k in kwargs if k not in allowed)
        if unknown:
            method_help = (
                "; ".join(
                    f"{name} ({spec.kind.__name__}, default {spec.default!r}): {spec.help}"
                    for name, spec in cls.method_args.items()
                )
                or "none"
            )
            raise ValueError(
                f"Unknown model argument(s) for --model {cls.method} with backend={cls.backend_name}: "
                f"{', '.join(unknown)}.\n"
                f"  Method arguments: {method_help}.\n"
                f"  Backend: backend ({', '.join(sorted(cls.backends))}).\n"
                f"  {cls.backend_name} arguments: {', '.join(sorted(allowed))}."
            )
        return method_values, kwargs

    @classmethod
    def check_method_args(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Checks between method arguments and defaults that depend on others (none by default)."""
        return values

    def init_measurement(self, meter, synchronize=None) -> None:
        self.decodebench_recorder = Recorder(
            meter, synchronize=synchronize, summarize_method_stats=self.summarize_method_stats
        )

    # -- method hooks ---------------------------------------------------------------------
    def summarize_method_stats(self, records: list[RequestRecord]) -> dict[str, Any]:
        """Aggregate the per-request ``method_stats`` of one task (default: sum the counters)."""
        return sum_numeric_stats(records)

    # -- reporting ------------------------------------------------------------------------
    def decodebench_info(self, pretrained: str, embedded: bool, device: str) -> dict[str, Any]:
        recorder = self.decodebench_recorder
        return {
            "version": __version__,
            "method": self.method,
            "method_label": self.method_label,
            "backend": self.backend_name,
            "method_args": dict(self.method_config),
            "pretrained": pretrained,
            "embedded_model": embedded,
            "machine": describe(device),
            "energy": recorder.energy_status(),
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


def check_complete(results: list[str | None]) -> list[str]:
    """Every request must have its answer: a gap would be scored as if the model had failed."""
    missing = [i for i, text in enumerate(results) if text is None]
    if missing:
        raise RuntimeError(f"no generation for {len(missing)} request(s) (positions {missing[:10]}...)")
    return results
