"""The served backend: any OpenAI-compatible server (``vllm serve``, ``decodebench serve``), measured from outside.

``lm_eval --model lz --model_args backend=served,base_url=http://127.0.0.1:8000/v1,num_concurrent=8`` builds
prompts exactly as lm-eval's ``local-completions`` model does (its ``LocalCompletionsAPI``: the same chat
templates, token-id prompts, stop sequences and payload), sends each request on its own, streamed, either with
``num_concurrent`` in flight (closed loop) or at ``request_rate`` requests per second (open loop, arrivals as
``vllm bench serve`` draws them: models/backends/served_load.py), over one HTTP session per run with as many
connections as requests may be in flight, and measures every request as ``vllm bench serve`` defines it:

- TTFT: from sending the request to the first chunk that carries generated text (or tokens), whatever else it
  carries;
- ITL (``chunk_gaps_s``, ``itl_chunk_s``): the raw gap between two streamed chunks of output, vLLM's definition;
  per token (``inter_token_s``, ``itl_s``): each gap divided by the tokens its chunk carries (speculative decoding
  sends several per chunk; the server's cumulative ``usage`` on every chunk says how many; a server that counts only
  at the end leaves it unknown, None);
- TPOT: (latency - TTFT) / (output tokens - 1), the first token excluded; latency (E2E): sending to the last chunk;
- output and prompt tokens: the server's ``usage``, not re-tokenized.

A task's tokens/s is its output tokens over the wall time of the whole task at that concurrency (throughput).
Around each task the server's Prometheus ``/metrics`` are read (``engine`` in the results): counter deltas
(speculative decoding's drafts and accepted tokens, prefix-cache queries and hits) and the peak of its running and
waiting requests. Energy: the
DCGM exporter at ``energy_url``, else NVML over every GPU when the server runs on this machine, else unavailable
with the reason. The backend knows no method: a method says what its requests carry (``vllm_sampling_kwargs``:
``extra_args`` travel as ``vllm_xargs``, penalties as themselves).

What the server sends is checked, never trusted: a stream must be server-sent events of the OpenAI schema that end
with a finish reason and ``[DONE]``, with ``usage`` present, whole, non-negative, never shrinking, at most
``max_tokens`` and not zero for text received (``StreamCheck``); anything else is a named error for that request.
Transient failures (connection lost, HTTP 429/500/502/503/504, a stream cut short) are retried up to
``max_retries`` attempts in all (lm-eval's API models' argument, default 3) with backoff, counted per request
(``retries``). Other faults end the run with what happened (unreachable server, a request the server refuses, a
redirect, a request past ``timeout``); answers already received stay in lm-eval's ``--use_cache``, so a rerun asks
only for the rest, and no results file is written for a failed run. Every other read (``/v1/models``,
``/metrics``) is bounded in time and size (measure/http.py). An API key travels as lm-eval's API models send it
(``OPENAI_API_KEY`` as a bearer token, or ``header=``) on every call, and is never written to the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import logging
import math
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from lm_eval.models.openai_completions import LocalCompletionsAPI

from decodebench.data.embedded import resolve_pretrained
from decodebench.measure import http
from decodebench.measure.energy import open_served_meter
from decodebench.measure.memory import NoMemory
from decodebench.models.backends.base import BackendLM
from decodebench.models.backends.served_load import Load, arrival_times, parse_slo
from decodebench.models.decoding import decoding_record
from decodebench.models.method import SERVER_DECODES, Method

log = logging.getLogger(__name__)

# counters of vLLM's /metrics whose growth over a task is recorded (speculative decoding, prefix cache)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# the peak of requests in flight as the client counted them (the server's gauges are sampled, a second apart)
CLIENT_PEAK = "client requests in flight"


# what a retry may cure; any other status is the server's answer
RETRY_STATUSES = (429, 500, 502, 503, 504)
# the most text one token may decode to (byte-level BPE's longest pieces are runs of spaces or symbols)
MAX_CHARS_PER_TOKEN = 256
# the most of /metrics the gauge watcher reads each second
METRICS_MAX_BYTES = 16 * 2**20
# the longest line of server-sent events a stream may send (one chunk's JSON; its text is bounded apart, by max_tokens)
MAX_LINE_BYTES = 2**20
# how far a server's usage.prompt_tokens may be from the prompt's tokens as sent (special tokens a server adds)
PROMPT_TOKENS_SLACK = 4
# the longest context a server's /v1/models may claim (beyond any model served today)
MAX_MODEL_LEN = 2**24
# the default limit between two data chunks of a stream (comments and keep-alives do not reset it), or the request's
# whole timeout where that is shorter
IDLE_TIMEOUT_S = 60.0


class ServedError(RuntimeError):
    """What went wrong between decodebench and the server; the message says what, and what to do."""


class TransientError(OSError):
    """A failure another attempt may cure: the server's 429/5xx, a broken HTTP answer, or a stream cut before its
    end."""


@dataclass
class Streamed:
    """One request, as it came back."""

    text: str = ""
    prompt_tokens: int = 0
    new_tokens: int = 0
    finish_reason: str = "length"
    ttft_s: float | None = None
    latency_s: float = 0.0
    inter_token_s: list[float] | None = field(default_factory=list)
    chunk_gaps_s: list[float] = field(default_factory=list)
    retries: int = 0
    sent_s: float | None = None
    spec_decode: dict[str, float] | None = None


async def sse_lines(content, deadline=lambda: math.inf):
    """A stream's lines, each with the time the block that completed it arrived. Read in whole blocks and split
    here, not line by line through aiohttp (a server writes several lines at once, and a readline per line cost the
    client ~30% of its time at 64 requests in flight); a line longer than MAX_LINE_BYTES is refused. ``deadline()``:
    the ``time.perf_counter()`` by which the next block must have come (the caller moves it on data, not on comments),
    else ``StalledError``. One timer for the whole stream, moved after each block (a timeout task per read cost the
    client its throughput at many requests in flight)."""
    loop = asyncio.get_running_loop()

    def due() -> float | None:  # the deadline on the event loop's clock
        left = deadline() - time.perf_counter()
        return None if math.isinf(left) else loop.time() + max(0.0, left)

    pending = b""
    try:
        async with asyncio.timeout(due()) as idle:
            async for block in content.iter_any():
                now = time.perf_counter()
                *lines, pending = (pending + block).split(b"\n")
                if len(pending) > MAX_LINE_BYTES or any(len(line) > MAX_LINE_BYTES for line in lines):
                    raise ServedError(
                        f"the stream is not server-sent events: a line longer than {MAX_LINE_BYTES} bytes"
                    )
                for line in lines:
                    yield line, now
                idle.reschedule(due())
    except TimeoutError:
        if time.perf_counter() < deadline():  # the request's total timeout, not the idle limit
            raise
        raise StalledError() from None
    if pending:
        yield pending, time.perf_counter()


class StalledError(ServedError):
    """No data chunk came within the idle limit."""


class StreamCheck:
    """One streamed answer's chunks, checked as they come: the OpenAI completions schema, the finish reason and
    ``[DONE]``, and the server's token counts (``usage``), which decide throughput and so are never taken on trust."""

    def __init__(self, max_tokens: int, model: str | None = None, prompt_tokens_sent: int | None = None):
        self.max_tokens = int(max_tokens)
        self.model = model  # the model asked for: every chunk that names one must name it
        self.prompt_tokens_sent = prompt_tokens_sent
        self.text_chunks = 0
        self.completion_tokens = 0
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.text_chars = 0
        self.chunk_had_usage = False
        self.spec_decode: dict[str, float] | None = None  # vLLM's per-request acceptance, where the server sends it

    def chunk(self, data: str) -> tuple[list[dict], int]:
        """The chunk's choices and how many tokens it adds; a ``ServedError`` saying what is wrong with it."""
        if self.done:
            raise ServedError(f"the server sent data after [DONE]: {data[:200]!r}")
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ServedError(f"a stream chunk is not JSON: {data[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise ServedError(f"a stream chunk is not a JSON object: {data[:200]!r}")
        if "error" in chunk:
            raise ServedError(f"the server reported an error mid-stream: {str(chunk['error'])[:500]}")
        if self.model is not None and "model" in chunk and chunk["model"] != self.model:
            raise ServedError(
                f"the stream answers for model {chunk['model']!r}, not {self.model!r}, the model asked for"
            )
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise ServedError(f"a stream chunk has no list of choices (not the completions schema): {data[:200]!r}")
        for choice in choices:
            # one completion was asked for: choice 0; another index is another answer, never part of this one
            index = choice.get("index", 0)
            if index != 0:
                raise ServedError(f"a chunk of choice {index!r}, where one completion (choice 0) was asked for")
            text = choice.get("text")
            if text is not None and not isinstance(text, str):
                raise ServedError(f"a choice's text is not a string: {data[:200]!r}")
            if text and self.finish_reason is not None:
                raise ServedError(f"the server sent text after the finish reason: {data[:200]!r}")
            self.text_chars += len(text or "")
            self.text_chunks += bool(text)
            if choice.get("finish_reason"):
                self.finish_reason = _finish_reason(choice)
        if self.text_chars > MAX_CHARS_PER_TOKEN * self.max_tokens:
            raise ServedError(f"the server sent more text than {self.max_tokens} tokens (max_tokens) can decode to")
        if isinstance(chunk.get("metrics"), dict) and chunk["metrics"].get("speculative_decoding") is not None:
            self.spec_decode = _spec_decode(chunk["metrics"]["speculative_decoding"], data)
        return choices, self._usage(chunk.get("usage"), data)

    def _usage(self, usage, data: str) -> int:
        self.chunk_had_usage = usage is not None
        if usage is None:
            return 0
        if not isinstance(usage, dict):
            raise ServedError(f"usage is not an object: {data[:200]!r}")
        counts = {}
        for key in ("prompt_tokens", "completion_tokens"):
            value = usage.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ServedError(f"usage.{key}={value!r}: expected a whole number >= 0 ({data[:200]!r})")
            counts[key] = value
        grown = counts["completion_tokens"] - self.completion_tokens
        if grown < 0:
            raise ServedError(
                f"usage.completion_tokens went down from {self.completion_tokens} to {counts['completion_tokens']}"
            )
        if counts["completion_tokens"] > self.max_tokens:
            raise ServedError(
                f"usage.completion_tokens={counts['completion_tokens']} for a request of max_tokens={self.max_tokens}"
            )
        self.completion_tokens, self.prompt_tokens = counts["completion_tokens"], counts["prompt_tokens"]
        return grown

    def finish(self) -> None:
        """At the stream's end: a cut stream is transient (retried); missing or inconsistent counts are not."""
        if self.finish_reason is None or not self.done:
            missing = "a finish reason" if self.finish_reason is None else "[DONE]"
            raise TransientError(f"the stream ended before {missing} (cut short)")
        if self.prompt_tokens is None:
            raise ServedError(
                "the stream carried no usage: decodebench takes token counts from the server (it asks for them "
                "with stream_options include_usage and continuous_usage_stats)"
            )
        if self.text_chars and not self.completion_tokens:
            raise ServedError(f"the server sent {self.text_chars} characters of text with usage.completion_tokens=0")
        if self.completion_tokens < self.text_chunks:  # each chunk of text is at least one token decoded
            raise ServedError(
                f"usage.completion_tokens={self.completion_tokens} for {self.text_chunks} chunks of text: each chunk "
                "carries at least one token"
            )
        if self.finish_reason == "length" and not self.completion_tokens:
            raise ServedError("finish_reason 'length' (max_tokens reached) with no token and no text")
        sent = self.prompt_tokens_sent
        if sent is not None and abs(self.prompt_tokens - sent) > PROMPT_TOKENS_SLACK:
            raise ServedError(
                f"usage.prompt_tokens={self.prompt_tokens} for a prompt sent as {sent} tokens (allowed: within "
                f"{PROMPT_TOKENS_SLACK}, for special tokens a server adds)"
            )


def server_root(base_url: str) -> str:
    """``http://host:port`` of a base_url given as ``.../v1`` or ``.../v1/completions``."""
    parsed = urlparse(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"base_url={base_url!r}: expected http://HOST:PORT/v1")
    return f"{parsed.scheme}://{parsed.netloc}"


def auth_headers(header: dict | None = None) -> dict[str, str]:
    """What lm-eval's API models send: ``header=`` when given, else ``OPENAI_API_KEY`` as a bearer token."""
    if isinstance(header, str):  # from --model_args: JSON
        header = json.loads(header)
    if header:
        return {str(key): str(value) for key, value in dict(header).items()}
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def served_models(root: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> list[dict]:
    """The server's ``/v1/models``, or a ServedError that says it cannot be reached or read."""
    try:
        cards = json.loads(http.get(f"{root}/v1/models", headers, timeout_s, max_bytes=2**20))["data"]
        if not isinstance(cards, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cards):
            raise ValueError("its data is not a list of models with ids")
        return cards
    except OSError as exc:
        hint = " (it wants an API key: set OPENAI_API_KEY)" if getattr(exc, "code", None) == 401 else ""
        raise ServedError(
            f"cannot reach an OpenAI-compatible server at {root} ({exc}){hint}; start one with `decodebench serve`, "
            "or check base_url"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ServedError(f"{root}/v1/models is not an OpenAI model listing ({exc})") from None


class ServedBackend(BackendLM, LocalCompletionsAPI):
    backend_name = "served"
    capabilities = frozenset({SERVER_DECODES})

    def __init__(
        self,
        method: Method,
        base_url: str | None = None,
        pretrained: Any = None,
        model: str | None = None,
        tokenizer: str | None = None,
        num_concurrent: int | None = None,
        energy_url: str | None = None,
        timeout: int = 600,
        idle_timeout: float | None = None,
        warmup: int = 0,
        max_length: int | None = None,
        request_rate: float | None = None,
        burstiness: float | None = None,
        max_concurrency: int | None = None,
        slo: str | None = None,
        **kwargs,
    ):
        self.method = method
        if not base_url:
            raise ValueError(
                "backend=served needs base_url=http://HOST:PORT/v1, an OpenAI-compatible server such as `vllm "
                "serve` (`decodebench serve` starts one)"
            )
        self.server = server_root(base_url)
        self.warmup = int(warmup) if str(warmup).isdigit() else -1
        if self.warmup < 0:
            raise ValueError(f"warmup={warmup!r}: untimed requests before each task's timed ones, a whole number >= 0")
        default = min(IDLE_TIMEOUT_S, float(timeout))
        self.idle_timeout = default if idle_timeout is None else float(idle_timeout)
        if not (math.isfinite(self.idle_timeout) and 0 < self.idle_timeout <= float(timeout)):
            raise ValueError(
                f"idle_timeout={idle_timeout!r}: seconds a stream may go without data, in (0, timeout={timeout}]"
            )
        # the load and the objectives are checked before the server is asked anything
        self.load = Load.from_args(num_concurrent, request_rate, burstiness, max_concurrency, kwargs.get("seed", 1234))
        objectives = parse_slo(slo) if slo is not None else None
        self.server_headers = auth_headers(kwargs.get("header"))
        models = served_models(self.server, self.server_headers)
        ids = [card["id"] for card in models]
        if model is None and len(ids) != 1:
            raise ValueError(f"the server at {self.server} serves {ids}: say which with model=<id>")
        model = model or ids[0]
        if model not in ids:
            raise ValueError(f"model={model!r} is not served at {self.server}; it serves {ids}")
        card = next(c for c in models if c["id"] == model)
        self.context_len = int(max_length or checked_model_len(card, self.server) or 2048)
        # the tokenizer that builds prompts here: the one given, else `pretrained` (the embedded model's by
        # default, which `decodebench serve` serves), else the served model's own id (a hub id or a local path)
        if tokenizer is None:
            tokenizer, self.uses_embedded_model = resolve_pretrained(pretrained) if pretrained else (model, False)
        else:
            self.uses_embedded_model = False
        super().__init__(
            base_url=f"{self.server}/v1/completions",
            model=model,
            tokenizer=str(tokenizer),
            tokenizer_backend="huggingface",
            num_concurrent=self.load.in_flight or 1,
            timeout=int(timeout),
            max_length=self.context_len,
            tokenized_requests=True,
            **kwargs,
        )
        self.pretrained_name = model
        self.init_measurement(
            open_served_meter(base_url, energy_url), memory=NoMemory("the model runs in the server's processes")
        )
        self.decodebench_recorder.slo = objectives
        # one event loop and one HTTP session for the whole run: connections stay warm from task to task
        self._loop = asyncio.Runner()
        self._http: dict[str, Any] = {}
        weakref.finalize(self, _close_http, self._loop, self._http)
        method.setup(self)

    @classmethod
    def accepted_args(cls):
        named = set()
        for klass in (LocalCompletionsAPI, LocalCompletionsAPI.__mro__[1]):
            params = inspect.signature(klass.__init__).parameters.values()
            named |= {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        own = {"energy_url", "request_rate", "burstiness", "max_concurrency", "slo", "idle_timeout", "warmup"}
        return sorted((named | own) - {"self", "tokenizer_backend", "tokenized_requests"})

    # -- lm-eval API: generate_until is BackendLM's; its step (a task is one batch) ----------
    def generate_batch_measured(self, task: str, batch: list, answered) -> list[str]:
        """Every request of a task sent under the run's load (closed loop or arrivals), the server's counters read
        around the task's window."""
        payloads, decodings, cuts = zip(*(self._payload(request) for request in batch), strict=True)
        if cut := [n for n in cuts if n]:  # never silent: said here, and recorded with the task
            log.warning(
                "task %s: %d of %d prompts cut from the left by up to %d tokens to fit a context of %d tokens "
                "(max_model_len, or max_length=...) with their max_gen_toks",
                task,
                len(cut),
                len(batch),
                max(cut),
                self.context_len,
            )
        if self.warmup:  # untimed, before the window opens: in no quality, speed or counter figure
            self._loop.run(self._warm_up(task, list(payloads[: self.warmup])))
        before = self._scrape()
        arrivals = (
            arrival_times(len(batch), self.load.request_rate, self.load.burstiness, self.load.seed)
            if self.load.open
            else None
        )
        with self.decodebench_recorder.open(task) as window:
            peaks: dict[str, float] = {}
            streamed = self._loop.run(self._send_all(task, batch, list(payloads), arrivals, peaks, answered))
        window.engine = self._server_counters(before, self._scrape(), peaks)
        window.engine[f"peak {CLIENT_PEAK}"] = peaks.get(CLIENT_PEAK, 0)
        window.engine["warm-up requests (untimed)"] = min(self.warmup, len(batch))
        window.engine["prompts cut to fit max_model_len"] = sum(1 for n in cuts if n)
        window.engine["peak tokens cut from a prompt"] = max(cuts)
        window.load = self.load.describe()
        if arrivals is not None:
            window.load["arrivals_s"] = arrivals.tolist()
        for request, out, decoding in zip(batch, streamed, decodings, strict=True):
            window.record(
                request,
                prompt_tokens=out.prompt_tokens,
                new_tokens=out.new_tokens,
                finish_reason=out.finish_reason,
                batch_size=self.load.in_flight or 1,
                ttft_s=out.ttft_s,
                latency_s=out.latency_s,
                inter_token_s=out.inter_token_s,
                chunk_gaps_s=out.chunk_gaps_s,
                sent_s=out.sent_s,
                spec_decode=out.spec_decode,
                retries=out.retries,
                text=out.text,
                decoding=decoding,
            )
        return [out.text for out in streamed]

    def _payload(self, request) -> tuple[dict, dict, int]:
        """The request as lm-eval's local-completions would send it, streamed, carrying what the method adds; the
        decoding it asks for; how many tokens were cut off the prompt's start to fit the server's context."""
        context, gen_kwargs = request.args
        kwargs = self.with_sampling_defaults(copy.deepcopy(gen_kwargs))
        max_gen_toks = kwargs.get("max_gen_toks", self._max_gen_toks)
        room = self.max_length - max_gen_toks  # lm-eval's max_length keeps one token of the context spare
        if room < 1:
            raise ServedError(
                f"a context of {self.context_len} tokens (max_model_len of {self.server}, or max_length) leaves no "
                f"room for a prompt before max_gen_toks={max_gen_toks} new tokens"
            )
        tokens = self.tok_encode(context, add_special_tokens=self.add_bos_token)
        cut = max(0, len(tokens) - room)
        tokens = tokens[cut:]
        payload = self._create_payload(
            self.create_message([tokens]), generate=True, gen_kwargs=kwargs, seed=self._seed, eos=self.eos_string
        )
        method = self.method.vllm_sampling_kwargs({})
        extra = method.pop("extra_args", None)
        if extra:  # vllm_xargs values are strings or numbers: booleans travel as "true"/"false"
            extra = {k: str(v).lower() if isinstance(v, bool) else v for k, v in extra.items()}
            payload["vllm_xargs"] = {**payload.get("vllm_xargs", {}), **extra}
        payload.update(method)
        payload.update(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
        temperature = float(payload.get("temperature") or 0)
        decoding = decoding_record(temperature > 0, temperature, payload.get("top_k"), payload.get("top_p"))
        return payload, decoding, cut

    async def _session(self):
        """The run's HTTP session, made on first use in the run's event loop: as many connections as requests may
        be in flight (aiohttp's default of 100 queued the rest inside the client, counted as their TTFT)."""
        import aiohttp

        if "session" not in self._http:
            connector = aiohttp.TCPConnector(limit=self.load.in_flight or 0, limit_per_host=0)
            self._http["session"] = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout)
            )
        return self._http["session"]

    async def _warm_up(self, task: str, payloads: list[dict]) -> None:
        """The task's first requests, sent once untimed under the run's concurrency, their answers dropped: a fresh
        server compiles and fills its prefix cache on its first pass (``vllm bench serve --num-warmups``)."""
        session = await self._session()
        in_flight = asyncio.Semaphore(self.load.in_flight or len(payloads))

        async def one(payload) -> None:
            async with in_flight:
                await self._send(session, payload)

        try:
            await asyncio.gather(*(one(payload) for payload in payloads))
        except ServedError as exc:
            raise ServedError(f"task {task}, warm-up (warmup={self.warmup}): {exc}") from None

    async def _send_all(
        self, task: str, batch: list, payloads: list[dict], arrivals, peaks: dict, answered
    ) -> list[Streamed]:
        """Every request of a task: ``load.in_flight`` at a time (closed loop), or each at its arrival time
        (open loop, capped by ``max_concurrency`` when given)."""
        session = await self._session()
        in_flight = asyncio.Semaphore(self.load.in_flight) if self.load.in_flight else None
        done = sending = 0
        start = time.perf_counter()
        watcher = asyncio.create_task(self._watch_gauges(session, peaks))

        async def sent(payload) -> Streamed:
            # the client's own count of its requests in flight: exact over any window, however short
            nonlocal sending
            sending += 1
            peaks[CLIENT_PEAK] = max(peaks.get(CLIENT_PEAK, 0), sending)
            try:
                return await self._send(session, payload, start)
            finally:
                sending -= 1

        async def one(number, request, payload) -> Streamed:
            nonlocal done
            if arrivals is not None:
                await asyncio.sleep(max(0.0, start + arrivals[number] - time.perf_counter()))
            try:
                if in_flight is None:
                    out = await sent(payload)
                else:
                    async with in_flight:
                        out = await sent(payload)
            except ServedError as exc:
                raise ServedError(f"the request for document {request.doc_id}: {exc}") from None
            done += 1
            answered(request, out.text)  # cached now: kept if a later one fails
            return out

        try:
            return await asyncio.gather(*(one(i, r, p) for i, (r, p) in enumerate(zip(batch, payloads, strict=True))))
        except ServedError as exc:
            raise ServedError(f"task {task}: {exc} ({done} of {len(batch)} requests had been answered)") from None
        finally:
            watcher.cancel()

    async def _send(self, session, payload: dict, start: float | None = None) -> Streamed:
        """One streamed request; transient failures retried with backoff (``max_retries`` attempts in all)."""
        import aiohttp

        last = None
        sent = time.perf_counter() - start if start is not None else None
        for attempt in range(self.max_retries):
            try:
                out = await self._stream(session, payload)
                out.retries, out.sent_s = attempt, sent
                return out
            except TransientError as exc:
                last = f"the server at {self.server} failed a request: {exc}"
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                last = f"the server at {self.server} stopped answering ({type(exc).__name__}: {exc})"
            except aiohttp.ClientError as exc:  # an HTTP answer aiohttp could not read: a bad status line, headers
                last = f"the server at {self.server} sent a broken HTTP answer ({type(exc).__name__}: {exc})"
            except TimeoutError:
                raise ServedError(
                    f"a request took more than timeout={self.timeout} s; raise --model_args timeout=... or lower "
                    "the load (num_concurrent)"
                ) from None
            if attempt + 1 < self.max_retries:
                await asyncio.sleep(min(10, 0.5 * 2**attempt))
        raise ServedError(f"{last}, after {self.max_retries} attempts (max_retries)")

    async def _stream(self, session, payload: dict) -> Streamed:
        out = Streamed()
        prompt = payload.get("prompt")
        sent = len(prompt[0]) if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) else None
        check = StreamCheck(payload["max_tokens"], self.model, sent)
        started = last = last_data = time.perf_counter()
        text_parts = []
        async with session.post(self.base_url, json=payload, headers=self.header, allow_redirects=False) as response:
            if response.status >= 300:
                message = (await response.content.read(1000)).decode("utf-8", errors="replace")
                if response.status in RETRY_STATUSES:
                    raise TransientError(f"HTTP {response.status}: {message}")
                where = f" to {response.headers.get('Location')}" if 300 <= response.status < 400 else ""
                raise ServedError(f"the server refused a request (HTTP {response.status}{where}): {message}")
            if response.content_type != "text/event-stream":
                body = (await response.content.read(200)).decode("utf-8", errors="replace")
                raise ServedError(
                    f"the server answered a streamed request with {response.content_type or 'no content type'}, "
                    f"not server-sent events (text/event-stream): {body!r}"
                )
            counted = True  # every chunk with text carried the server's token count so far
            try:
                # closed however the loop ends, so that its idle timer never outlives the stream
                stream = sse_lines(response.content, deadline=lambda: last_data + self.idle_timeout)
                async with contextlib.aclosing(stream) as lines:
                    async for raw, now in lines:
                        line = raw.decode("utf-8", errors="replace").strip()
                        if not line.startswith("data:"):  # blank lines, comments, event:/id:/retry: fields
                            continue
                        last_data = now
                        data = line[5:].strip()
                        if data == "[DONE]":
                            check.done = True
                            continue
                        choices, grown = check.chunk(data)
                        text = "".join(choice.get("text") or "" for choice in choices)
                        text_parts.append(text)
                        counted = counted and (check.chunk_had_usage or not text)
                        # a chunk of output: it carries text, or tokens the server counted as they came (not the
                        # total of a server that counts only at the end)
                        if not (text or (grown > 0 and counted)):
                            continue
                        if out.ttft_s is None:
                            out.ttft_s = now - started
                        else:
                            out.chunk_gaps_s.append(now - last)
                            if grown > 0 and counted:  # the gap, shared by the tokens this chunk carries
                                out.inter_token_s += [(now - last) / grown] * grown
                        last = now
            except StalledError:
                raise ServedError(
                    f"no data from the server for {self.idle_timeout:g} s (idle_timeout; comments and keep-alives do "
                    f"not count): the stream stalled after {len(text_parts)} chunks"
                ) from None
        check.finish()
        if not counted:  # per-token gaps are unknown where the server counted tokens only at the end
            out.inter_token_s = None
        out.latency_s = time.perf_counter() - started
        out.text, out.new_tokens = "".join(text_parts), check.completion_tokens
        out.prompt_tokens, out.finish_reason = check.prompt_tokens, check.finish_reason
        out.spec_decode = check.spec_decode
        return out

    # -- the server's own counters ------------------------------------------------------------
    def _scrape(self) -> dict[str, float] | None:
        from decodebench.measure.prometheus import ScrapeError, scrape

        try:
            return scrape(f"{self.server}/metrics", headers=self.server_headers)
        except ScrapeError as exc:
            log.warning("server counters unavailable: %s", exc)
            return None

    async def _watch_gauges(self, session, peaks: dict) -> None:
        """The peak of the server's running and waiting requests while the task runs (read once a second)."""
        import aiohttp
        from prometheus_client.parser import text_string_to_metric_families

        bounded = aiohttp.ClientTimeout(total=5)
        while True:
            try:
                async with session.get(
                    f"{self.server}/metrics", headers=self.server_headers, timeout=bounded, allow_redirects=False
                ) as response:
                    body = await response.content.read(METRICS_MAX_BYTES)
                for family in text_string_to_metric_families(body.decode("utf-8", errors="replace")):
                    for sample in family.samples:
                        if sample.name in GAUGES and math.isfinite(sample.value):
                            peaks[sample.name] = max(peaks.get(sample.name, 0.0), sample.value)
            except Exception:  # a missed reading costs nothing but the reading
                pass
            await asyncio.sleep(1.0)

    @staticmethod
    def _server_counters(before, after, peaks: dict) -> dict[str, Any]:
        from decodebench.measure.prometheus import deltas

        if before is None or after is None:
            return {"unavailable": "the server's /metrics could not be read"}
        from decodebench.measure.vllm_counters import COUNTER_PREFIXES, mean_acceptance_length

        counters: dict[str, Any] = deltas(before, after, COUNTER_PREFIXES)
        counters.update({f"peak {name}": value for name, value in peaks.items()})
        if (length := mean_acceptance_length(counters)) is not None:
            counters["mean_acceptance_length"] = length
        return counters

    def answer_source(self) -> dict:
        return {"server": self.server}  # --use_cache must not answer one server's run with another's answers

    def get_model_info(self) -> dict:
        return {"decodebench": self.decodebench_info(self.pretrained_name, self.uses_embedded_model, self.server)}


def _spec_decode(metrics, data: str) -> dict[str, float]:
    """vLLM 0.32's per-request speculative-decoding metrics (``vllm serve --per-request-spec-decode-metrics
    summary``, on the last usage chunk), checked: the mean acceptance length (the bonus token included, >= 1) and the
    draft acceptance rate (in [0, 1])."""
    if not isinstance(metrics, dict):
        raise ServedError(f"metrics.speculative_decoding is not an object: {data[:200]!r}")
    found = {}
    for key, low, high in (("mean_acceptance_length", 1.0, math.inf), ("draft_acceptance_rate", 0.0, 1.0)):
        value = metrics.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ServedError(f"metrics.speculative_decoding.{key}={value!r}: expected a number in [{low}, {high}]")
        found[key] = float(value)
    return found


def _close_http(loop: asyncio.Runner, http: dict) -> None:
    """At the backend's end: its session's connections closed in the loop that opened them, then the loop. The
    collector may call this inside another event loop (a caller's own asyncio code), where a loop cannot be run:
    then on a thread of its own."""

    def close() -> None:
        if "session" in http:
            loop.run(http.pop("session").close())
        loop.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        close()
        return
    closer = threading.Thread(target=close, name="decodebench-close-http")
    closer.start()
    closer.join()


def checked_model_len(card: dict, server: str) -> int | None:
    """The context length a server's /v1/models claims for the model (None where it says none), checked before
    anything is sent: the client cuts every prompt to fit it."""
    value = card.get("max_model_len")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MODEL_LEN:
        raise ServedError(
            f"{server}/v1/models gives max_model_len={value!r} for {card['id']!r}: expected a whole number of tokens "
            f"in [1, {MAX_MODEL_LEN}]"
        )
    return value


def _finish_reason(choice: dict) -> str:
    """OpenAI's finish_reason, with vLLM's stop_reason: None for EOS, the stop string (or token) otherwise."""
    if choice.get("finish_reason") == "length":
        return "length"
    return "eos" if choice.get("stop_reason") is None else "stop"
