"""The transformers backend: lm-eval's HFLM with measured generation; it knows no method.

``generate_until`` (``models/backends/base.py``) keeps HFLM's semantics here (``batches``: requests grouped by
generation kwargs, sorted longest-first, left-padded batches of ``batch_size``; ``max_gen_toks``, stop sequences plus
EOS, text cut at the first stop) but runs task by task and batch by batch inside a measurement
window, so every request gets its own record. Each batch is decoded by the method's
``hf_decode`` hook (``models/method.py``); the default is ``generate_batch``, which is
``model.generate`` exactly as HFLM calls it, with the method's ``hf_generate_kwargs``.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from transformers import LogitsProcessorList
from transformers.generation.streamers import BaseStreamer

from decodebench.data.embedded import resolve_pretrained
from decodebench.measure.energy import open_meter
from decodebench.measure.memory import open_memory_meter
from decodebench.models.backends.base import BackendLM
from decodebench.models.decoding import decoding_record
from decodebench.models.method import DecodeOutput, Method

log = logging.getLogger(__name__)

# Keys HFLM forwards to `from_pretrained` through **kwargs that users legitimately pass.
FROM_PRETRAINED_PASSTHROUGH = (
    "attn_implementation",
    "low_cpu_mem_usage",
    "device_map",
    "quantization_config",
    "use_safetensors",
    "cache_dir",
    "local_files_only",
    "token",
)


@dataclass
class BatchPlan:
    """One left-padded batch of one task, ready for the method's ``hf_decode``."""

    task: str
    requests: list  # lm-eval Instances, in batch order
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    until: list[str]  # stop sequences, EOS's text included
    max_new_tokens: int
    kwargs: dict[str, Any]  # model.generate's keyword arguments
    decoding: dict[str, Any]  # decodebench.models.decoding.decoding_record


class FirstTokenClock(BaseStreamer):
    """Notes when ``generate`` hands out its first new tokens (the prompt comes first)."""

    def __init__(self):
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:
            self.first_token_at = time.perf_counter()

    def end(self):
        pass


def check_finite_weights(model: torch.nn.Module, name: str) -> None:
    """NaN or infinite weights make every generation garbage (often empty) while the run looks normal: refused.

    A tensor is finite exactly when its minimum and maximum are (NaN propagates through both, an infinity is one of
    them): one reduction a tensor and one host read in all, where ``isfinite(...).all()`` builds a mask of every
    weight; every run on a model pays this check."""
    named = [(key, p.detach()) for key, p in model.named_parameters() if p.is_floating_point() and p.numel()]
    if not named:
        return
    extremes = torch.stack([torch.stack(torch.aminmax(parameter)).float() for _, parameter in named])
    finite = torch.isfinite(extremes).all(dim=1).tolist()
    bad = [key for (key, _), ok in zip(named, finite, strict=True) if not ok]
    if bad:
        raise ValueError(
            f"pretrained={name}: {len(bad)} weight tensor(s) hold NaN or infinite values ({', '.join(bad[:3])}); "
            "every generation would be garbage. The checkpoint is damaged, or was saved in a dtype that overflowed"
        )


class HFBackend(BackendLM, HFLM):
    backend_name = "hf"

    def __init__(self, method: Method, pretrained: Any = None, warmup: int = 0, **backend_kwargs):
        self.method = method
        self.warmup = int(warmup) if str(warmup).isdigit() else -1
        if self.warmup < 0:
            raise ValueError(f"warmup={warmup!r}: untimed requests before each task's timed ones, a whole number >= 0")
        self._warmed_tasks: set[str] = set()
        pretrained, self.uses_embedded_model = resolve_pretrained(pretrained)
        # HFLM's own `backend` argument (causal/seq2seq) is not ours: every method here is for
        # decoder-only models.
        from safetensors import SafetensorError

        try:
            super().__init__(pretrained=pretrained, backend="causal", **backend_kwargs)
        except SafetensorError as exc:  # safetensors names no file
            hint = "`decodebench prepare-model` rebuilds it" if self.uses_embedded_model else "replace the file"
            raise ValueError(f"pretrained={pretrained}: a weights file cannot be read ({exc}); {hint}") from None
        self.pretrained_name = pretrained if isinstance(pretrained, str) else type(pretrained).__name__
        check_finite_weights(self._model, self.pretrained_name)
        device = self.device if isinstance(self.device, torch.device) else torch.device(self.device)
        on_cuda = device.type == "cuda"
        self.init_measurement(
            open_meter(device.type, [device.index or 0] if on_cuda else None),
            synchronize=torch.cuda.synchronize if on_cuda else None,
            memory=open_memory_meter(device.type, device),
        )
        self._auto_batch_size: int | None = None
        method.setup(self)

    @classmethod
    def accepted_args(cls):
        params = inspect.signature(HFLM.__init__).parameters.values()
        named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        return sorted((named - {"self", "backend"}) | set(FROM_PRETRAINED_PASSTHROUGH) | {"warmup"})

    # -- decoding ---------------------------------------------------------------------------
    def decoding_settings(self, kwargs: dict[str, Any], method_defaults: dict[str, Any]) -> dict[str, Any]:
        """How ``model.generate`` decodes with ``kwargs``, as a ``decoding_record``.

        transformers' precedence: the request's settings, then the method's defaults (MTAD's
        Appendix F warping), then the model's ``generation_config``, then transformers' own
        defaults (top-k 50 when sampling). Row-decoding methods sample from these same settings,
        so a method and its baseline sample from the same distribution.
        """
        if not kwargs.get("do_sample"):
            return decoding_record(False)
        from transformers import GenerationConfig

        # transformers fills what neither the request nor the model sets from these (generation/utils.py)
        global_defaults = GenerationConfig._get_default_generation_params()
        model_config = self._model.generation_config

        def setting(key: str):
            for source in (kwargs, method_defaults, {key: getattr(model_config, key, None)}, global_defaults):
                if source.get(key) is not None:
                    return source[key]
            return None

        return decoding_record(True, setting("temperature"), setting("top_k"), setting("top_p"))

    def generate_batch(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, stop: list[str], max_new_tokens: int, kwargs
    ) -> DecodeOutput:
        """``model.generate`` on one left-padded batch, as HFLM calls it."""
        clock = FirstTokenClock()
        if isinstance(kwargs.get("logits_processor"), list):
            kwargs["logits_processor"] = LogitsProcessorList(kwargs["logits_processor"])
        sequences = self._model_generate(
            context=input_ids,
            attention_mask=attention_mask,
            stop=stop,
            max_length=input_ids.shape[1] + max_new_tokens,
            streamer=clock,
            **kwargs,
        )
        return DecodeOutput(tokens=sequences[:, input_ids.shape[1] :], first_token_at=clock.first_token_at)

    # -- lm-eval API: generate_until is BackendLM's; its two steps ---------------------------
    def generate_batch_measured(self, task: str, batch: list, answered) -> list[str]:
        """One batch as HFLM would generate it, decoded by the method inside a measurement window."""
        if self.warmup and task not in self._warmed_tasks:
            self._warm_up(self._plan_batch(task, batch[: self.warmup]))
            self._warmed_tasks.add(task)
        return self._decode_and_record(self._plan_batch(task, batch), answered)

    def _warm_up(self, plan: BatchPlan) -> None:
        """``warmup=N``: the first N requests of a task's first batch decoded once, untimed and unrecorded, before
        that batch (as ``vllm bench``'s warm-ups; N = batch size warms its exact shapes): a process's first decode
        pays for lazy CUDA initialization, kernel selection and allocator growth that no later one does. It is in
        no quality, speed or energy figure; a sampling method's random stream moves on by its draws."""
        self.method.hf_decode(
            self,
            plan.input_ids,
            plan.attention_mask,
            stop=plan.until,
            max_new_tokens=plan.max_new_tokens,
            kwargs=dict(plan.kwargs),
        )

    def _plan_batch(self, task: str, requests: list) -> BatchPlan:
        """One batch as HFLM would generate it: its prompts left-padded and truncated, stop sequences,
        the new-token budget, and ``generate``'s keyword arguments with every sampling default explicit."""
        gen_kwargs = requests[0].args[1]  # a batch shares its generation kwargs (batches)
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_gen_toks = kwargs.pop("max_gen_toks")
        max_ctx_len = self.max_length - max_gen_toks
        if max_ctx_len <= 0:
            raise ValueError(
                f"task {task} asks for max_gen_toks={max_gen_toks}, which leaves no room for the "
                f"prompt in max_length={self.max_length}; lower it with --gen_kwargs "
                f"max_gen_toks=N or raise --model_args max_length=M"
            )
        input_ids, attention_mask = self.tok_batch_encode(
            [request.args[0] for request in requests], left_truncate_len=max_ctx_len, truncation=self.truncation
        )
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        max_length = kwargs.pop("max_length", input_ids.shape[1] + max_gen_toks)
        decoding = self.decoding_settings(kwargs, self.method.sampling_defaults)
        if decoding["do_sample"]:  # explicit, so that what runs is what the results say
            kwargs.update(
                temperature=decoding["temperature"], top_k=decoding["top_k"] or 0, top_p=decoding["top_p"] or 1.0
            )
        return BatchPlan(
            task, requests, input_ids, attention_mask, until, max_length - input_ids.shape[1], kwargs, decoding
        )

    def _decode_and_record(self, plan: BatchPlan, answered) -> list[str]:
        """Decode one batch inside a measurement window, score it outside, and record each request."""
        with self.decodebench_recorder.open(plan.task, decoding=plan.decoding) as window:
            out = self.method.hf_decode(
                self,
                plan.input_ids,
                plan.attention_mask,
                stop=plan.until,
                max_new_tokens=plan.max_new_tokens,
                kwargs=plan.kwargs,
            )
            rows = out.tokens.tolist() if isinstance(out.tokens, torch.Tensor) else out.tokens
        ttft = out.first_token_at - window.started_at if out.first_token_at else None
        scores = self.method.hf_score(self, plan.input_ids, plan.attention_mask, rows)
        prompt_lengths = plan.attention_mask.sum(dim=1).tolist()
        texts = []
        for row, request in enumerate(plan.requests):
            text, new_tokens, finish = self._finish_row(rows[row], plan.until)
            window.record(
                request,
                prompt_tokens=prompt_lengths[row],
                new_tokens=new_tokens,
                finish_reason=finish,
                batch_size=len(plan.requests),
                ttft_s=ttft,
                method_stats={**(out.row_stats[row] if out.row_stats else {}), **(scores[row] if scores else {})},
                text=text,
            )
            answered(request, text)
            texts.append(text)
        return texts

    def get_model_info(self) -> dict:
        if isinstance(self.pretrained, str) and os.path.isdir(self.pretrained):
            # HFLM asks the hub for the model's commit; a local checkpoint has none.
            info = {
                "model_num_parameters": self._model.num_parameters(),
                "model_dtype": str(self._model.dtype),
                "model_revision": self.revision,
                "model_sha": "",
            }
        else:
            info = super().get_model_info()
        info["decodebench"] = self.decodebench_info(self.pretrained_name, self.uses_embedded_model, str(self.device))
        return info

    # -- helpers ------------------------------------------------------------------------
    def batches(self, requests, positions: list[int]) -> list[list[int]]:
        """HFLM's batching: same generation kwargs per batch, longest prompts first."""
        groups: dict[str, list[int]] = {}
        for position in positions:
            key = json.dumps(requests[position].args[1], sort_keys=True, default=str)
            groups.setdefault(key, []).append(position)
        size = self._batch_size()
        batches = []
        for group in groups.values():
            group.sort(key=lambda p: (-len(self.tok_encode(requests[p].args[0])), requests[p].args[0]))
            batches += [group[i : i + size] for i in range(0, len(group), size)]
        return batches

    def _batch_size(self) -> int:
        if isinstance(self.batch_size, int):
            return self.batch_size
        if self._auto_batch_size is None:
            self._auto_batch_size = int(self._detect_batch_size())
            log.info("batch_size=auto: using %d", self._auto_batch_size)
        return self._auto_batch_size

    def eos_ids(self) -> set[int]:
        ids = {self.eot_token_id}
        configured = getattr(self._model.generation_config, "eos_token_id", None)
        if isinstance(configured, int):
            ids.add(configured)
        elif configured:
            ids.update(configured)
        return ids

    def _finish_row(self, row: list[int], until: list[str]) -> tuple[str, int, str]:
        """Text (as HFLM would return it), counted new tokens, and why the row ended."""
        eos_ids = self.eos_ids()
        end = next((i + 1 for i, token in enumerate(row) if token in eos_ids), None)
        tokens, finish = (row[:end], "eos") if end is not None else (row, "length")

        def response(ids: list[int]) -> str:
            if isinstance(self.think_end_token, int) and self.think_end_token in ids:
                last = len(ids) - 1 - ids[::-1].index(self.think_end_token)
                return self.tok_decode(ids[last + 1 :]).lstrip()
            text = self.tok_decode(ids)
            if isinstance(self.think_end_token, str):
                text = text.split(self.think_end_token)[-1].lstrip()
            return text

        stops = [s for s in until if s]
        full = response(tokens)
        text = postprocess_generated_text(full, stops, None)
        count = len(tokens)
        if finish != "eos" and any(s in full for s in stops):
            # The row ran past its stop only because other rows were still decoding: count the
            # tokens up to the one that completed the stop sequence.
            finish = "stop"
            lo, hi = 1, len(tokens)
            while lo < hi:
                mid = (lo + hi) // 2
                if any(s in response(tokens[:mid]) for s in stops):
                    hi = mid
                else:
                    lo = mid + 1
            count = lo
        return text, count, finish
