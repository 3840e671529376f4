"""What every backend shares (``models/hf.py``, ``models/vllm.py``, ``models/served.py``; the table of them by name
is ``models/registry.py``): the embedded model as the default ``pretrained``, the measurement set-up and results
record, and the checks around ``generate_until`` (task by task, settings checked first, no request left unanswered).

A backend class is ``BackendLM`` placed before lm-eval's own model class (``HFLM``, ``VLLM``);
it knows its method only through the ``Method`` contract (``models/method.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from decodebench.models.method import Method

log = logging.getLogger(__name__)

# Where a decodebench run writes who it is into lm-eval's --use_cache database (lm-eval's own keys are sha256 hex)
CACHE_IDENTITY_KEY = "decodebench:identity"


class BackendLM:
    """Backend-independent part of every backend (a mixin placed before HFLM/VLLM)."""

    backend_name: ClassVar[str] = ""  # "hf" or "vllm" (not `backend`: HFLM uses that for causal/seq2seq)
    # what methods may ask of it (models/method.py: ENGINE_SPECULATES, SERVER_DECODES); transformers: none of them
    capabilities: ClassVar[frozenset[str]] = frozenset()
    method: Method

    @classmethod
    def accepted_args(cls) -> Sequence[str]:
        """Model arguments the backend itself accepts."""
        return ()

    @classmethod
    def check_backend_args(cls, args: dict[str, Any]) -> None:
        """Raise a ValueError naming any of the backend's own arguments whose value it cannot take (none by default:
        the library checks its own)."""

    @classmethod
    def check_method_args(cls, method: Method, args: dict[str, Any]) -> None:
        """Raise a ValueError when the backend's arguments contradict what the method needs of it (nothing by
        default)."""

    def warn_if_chat_template_unused(self, applied: bool) -> None:
        """Said before generation: a chat model prompted without its template often answers nothing at all
        (the embedded instruct model returns an empty string for every squad_mini and cnndm_mini document)."""
        tokenizer = getattr(self, "tokenizer", None)
        if not applied and getattr(tokenizer, "chat_template", None):
            log.warning(
                "%s has a chat template, but --apply_chat_template was not given: prompts go to it as plain text, and "
                "an instruct model often answers them with an empty string. Add --apply_chat_template to use it.",
                getattr(self, "pretrained_name", "the model"),
            )

    def answer_source(self) -> dict:
        """Who answers beyond the model and method (a served backend: the server), for the cache's identity."""
        return {}

    def check_shared_cache(self, cache, path: str) -> None:
        """lm-eval's ``--use_cache`` keys answers by request alone: a cache written by another method, other
        arguments or another model would answer for this one. The first decodebench run writes who it is into
        the cache; a run that is someone else is refused before any answer is read."""
        import json

        identity = json.dumps(
            {
                "method": self.method.name,
                "method_args": self.method.config.as_dict(),
                "pretrained": getattr(self, "pretrained_name", None),
                "backend": self.backend_name,
                **self.answer_source(),
            },
            sort_keys=True,
            default=str,
        )
        stored = cache.get(CACHE_IDENTITY_KEY)
        if stored is None and len(cache):
            raise ValueError(
                f"--use_cache {path} already holds {len(cache)} answers of a run that did not say what it was (another "
                "model, or lm-eval's own); its answers would be taken for this run's. Give each model, method and "
                "set of arguments its own --use_cache path"
            )
        if stored is not None and stored != identity:
            raise ValueError(
                f"--use_cache {path} holds the answers of {stored}; this run is {identity}, and lm-eval would answer "
                "it from them. Give each model, method and set of arguments its own --use_cache path"
            )
        cache[CACHE_IDENTITY_KEY] = identity

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

    from decodebench.models.decoding import check_generation_kwargs

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
