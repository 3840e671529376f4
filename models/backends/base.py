"""What every backend shares: ``BackendLM``, placed before lm-eval's own model class (``HFLM``, ``VLLM``,
``LocalCompletionsAPI``) in ``models/backends/hf.py``, ``models/backends/vllm.py`` and ``models/backends/served.py``
(their table by name is ``models/registry.py``).

It holds the one ``generate_until`` every backend runs: every request's settings checked before the first one runs,
task by task (so every speed and energy figure belongs to one task), each answer given to lm-eval's ``--use_cache``
as it comes, none left unanswered. A backend supplies two steps: how a task's requests split into batches
(``batches``) and how one batch is generated inside its measurement window and recorded request by request
(``generate_batch_measured``). Beside it: the measurement set-up, the results' description of the run, and the
``--use_cache`` identity check. A backend knows its method only through the ``Method`` contract
(``models/method.py``) and tells methods what it can do through ``capabilities``, never its name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
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

    # -- lm-eval API: the same for every backend -------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """lm-eval's ``generate_until``: settings checked first, then task by task and batch by batch, each batch
        generated and recorded by the backend (``generate_batch_measured``), every answer cached as it comes."""
        from tqdm import tqdm

        results: list[str | None] = [None] * len(requests)
        check_requests(requests)
        progress = tqdm(
            total=len(requests),
            disable=disable_tqdm or getattr(self, "rank", 0) != 0,
            desc=f"{self.method.name} ({self.backend_name}) generate_until",
        )

        def answered(request, text: str) -> None:  # kept at once: a later failure loses no answer already paid for
            self.cache_hook.add_partial("generate_until", request.args, text)
            progress.update(1)

        for task, positions in group_by_task(requests):
            for batch in self.batches(requests, positions):
                texts = self.generate_batch_measured(task, [requests[i] for i in batch], answered)
                for position, text in zip(batch, texts, strict=True):
                    results[position] = text
        progress.close()
        return check_complete(results)

    def batches(self, requests, positions: list[int]) -> list[list[int]]:
        """How one task's requests (their positions in ``requests``) split into batches, each one measurement
        window; by default the whole task at once (an engine that batches continuously takes them all)."""
        return [positions]

    def generate_batch_measured(self, task: str, batch: list, answered: Callable[[Any, str], None]) -> list[str]:
        """Generate one batch of a task's requests inside a measurement window, record each request, call
        ``answered(request, text)`` for each as soon as its answer is in hand, and return the texts in order."""
        raise NotImplementedError

    def with_sampling_defaults(self, gen_kwargs: dict[str, Any]) -> dict[str, Any]:
        """A request's generation settings with the method's sampling defaults where a sampling task sets none
        (an engine with a temperature setting: vLLM, a server; transformers' precedence is ``decoding_settings``)."""
        if float(gen_kwargs.get("temperature") or 0) > 0:
            return {**self.method.sampling_defaults, **gen_kwargs}
        return dict(gen_kwargs)

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
