"""An OpenAI-compatible completions server of the tests' own, on loopback, that misbehaves on request.

It streams as vLLM does (server-sent events, cumulative ``usage`` on every chunk, a usage-only last chunk, then
``[DONE]``) when ``mode`` is "good"; every other mode is one of the ways a real server (or a hostile one) has answered
decodebench, each with its exact input. It runs aiohttp's server on a thread of the test process: no sleep, no
subprocess; ``requests`` counts the completions asked for, ``headers`` keeps what each call sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

from aiohttp import web

MODEL = "fake-model"
GOOD_TOKENS = 5
# the first chunk's last stretch of waiting, spent yielding to the event loop instead of in epoll (which wakes up to
# 1 ms late): a TTFT exact to well under a millisecond
PRECISE_S = 0.002


class FakeOpenAI:
    def __init__(
        self,
        mode: str = "good",
        metrics: str = "good",
        api_key: str | None = None,
        gap_s: float = 0.0,
        first_s: float = 0.0,
        tokens: int | None = GOOD_TOKENS,
        cpus: set[int] | None = None,
    ):
        self.mode, self.metrics, self.api_key = mode, metrics, api_key
        # exactly known timing: the first chunk of text first_s after the request arrives (TTFT), each next one gap_s
        # after the one before (ITL), on a schedule fixed at arrival, so that a late write is not passed on to the
        # next gap; the usage chunk and [DONE] follow the last text at once. What the server did, in time.monotonic
        # seconds: ``timings``, per request (arrival, [each text chunk's write]), for a client's error against it
        self.first_s, self.gap_s = first_s, gap_s
        self.timings: list[tuple[float, list[float]]] = []
        self.cpus = cpus  # the server's own cores (its thread's affinity), so that a client on others cannot slow it
        self.tokens = tokens  # tokens per answer (one per chunk); None: as many as max_tokens asks
        self.model_len = 2048  # what /v1/models says of the model's context (max_model_len)
        self.hold_until = 0  # "hold": answer once this many requests are in flight at once (or after 30 s)
        self.in_flight = self.peak_in_flight = 0
        self.requests = 0
        self.headers: list[dict] = []
        self.payloads: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._started.wait(30)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)  # 0: this thread alone
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.add_routes(
            [
                web.get("/v1/models", self._models),
                web.post("/v1/completions", self._completions),
                web.get("/metrics", self._metrics),
            ]
        )
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- endpoints ---------------------------------------------------------------------------------------------
    def _refused(self, request) -> web.Response | None:
        self.headers.append(dict(request.headers))
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "invalid API key"}, status=401)
        return None

    async def _models(self, request):
        if refused := self._refused(request):
            return refused
        return web.json_response({"object": "list", "data": [{"id": MODEL, "max_model_len": self.model_len}]})

    async def _metrics(self, request):
        if refused := self._refused(request):
            return refused
        if self.metrics == "nan":
            return web.Response(text="# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running NaN\n")
        if self.metrics == "trickle":  # one byte at a time, for ever
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await response.prepare(request)
            while True:
                await response.write(b"#")
                await asyncio.sleep(0.2)
        return web.Response(
            text="# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total 10\n"
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
        )

    async def _completions(self, request):
        arrived = time.monotonic()
        if refused := self._refused(request):
            return refused
        self.requests += 1
        payload = await request.json()
        self.payloads.append(payload)
        mode = self.mode
        if mode == "503 once":
            if self.requests == 1:
                return web.Response(status=503, text="overloaded")
            mode = "good"
        if mode == "bad status line":  # bytes that are not HTTP where the status line belongs, then the end
            request.transport.write(b"HTTP/1.1 2OO OK\r\nContent-Type: text/event-stream\r\n\r\n")
            request.transport.close()
            return web.Response()
        if mode == "redirect":
            raise web.HTTPTemporaryRedirect("http://192.0.2.1:9/v1/completions")
        if mode == "plain json":  # a non-streamed answer to a streamed request
            return web.json_response(
                {
                    "choices": [{"index": 0, "text": "Paris", "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
                }
            )
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if mode == "hold":
                for _ in range(3000):  # until enough are in flight at once, at most 30 s
                    if self.peak_in_flight >= self.hold_until:
                        break
                    await asyncio.sleep(0.01)
                mode = "good"
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            max_tokens = int(payload["max_tokens"])
            tokens = max_tokens if self.tokens is None else min(self.tokens, max_tokens)
            due, written = arrived, []
            prompt = payload["prompt"]
            sent = len(prompt[0]) if isinstance(prompt, list) and isinstance(prompt[0], list) else len(prompt)
            for number, line in enumerate(self._stream(mode, tokens, sent)):
                delay = self.first_s if number == 0 else self.gap_s if '"text"' in line else 0
                if delay:
                    due += delay
                    await asyncio.sleep(max(0.0, due - time.monotonic() - (PRECISE_S if number == 0 else 0)))
                    while number == 0 and time.monotonic() < due:  # the TTFT to the timer's resolution, not
                        await asyncio.sleep(0)  # epoll's millisecond (a later chunk's lateness is not passed on)
                await response.write(f"data: {line}\n\n".encode())
                if '"text"' in line:
                    written.append(time.monotonic())
                if mode == "stall":  # after the first chunk only keep-alive comments, for ever
                    while True:
                        await asyncio.sleep(0.1)
                        await response.write(b": ping\n\n")
            await response.write_eof()
            self.timings.append((arrived, written))
            return response
        finally:
            self.in_flight -= 1

    @staticmethod
    def _stream(mode: str, tokens: int, prompt_tokens: int) -> list[str]:
        if mode == "not json":
            return ["hello, this is not JSON"]
        if mode == "endless line":  # 4 MiB with no end of line: a client that waits for one buffers it all
            return ["x" * (4 * 2**20)]
        counts = list(range(1, tokens + 1))
        if mode == "empty length":  # max_tokens reached, with no token and no text
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
            return [
                json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}),
                "[DONE]",
            ]
        if mode == "undercounted":  # every chunk of text, one token in all
            counts = [1] * tokens
        elif mode == "huge prompt usage":
            prompt_tokens = 10**12
        if mode == "negative usage":
            counts = [-3] * tokens
        elif mode == "inflated usage":  # 1,500 output tokens for a request capped far lower
            counts = [1500] * tokens
        elif mode == "huge usage":
            counts = [10**10] * tokens
        chunks = []
        for position, count in enumerate(counts):
            last = position == tokens - 1
            chunk = {"model": "other-model" if mode == "other model" else MODEL}
            chunk["choices"] = [{"index": 0, "text": " word", "finish_reason": "length" if last else None}]
            if mode not in ("no usage", "usage at end"):  # OpenAI's API without continuous usage: the end only
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": count}
                chunk["usage"] = {**usage, "total_tokens": prompt_tokens + count}
            chunks.append(json.dumps(chunk))
            if mode == "other choice" and position == 0:  # a second completion's text, interleaved
                chunks.append(json.dumps({"model": MODEL, "choices": [{"index": 1, "text": " other"}]}))
        if mode == "cut":  # the connection closes cleanly before the finish reason
            return chunks[:2]
        if mode == "usage at end":
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": tokens,
                "total_tokens": prompt_tokens + tokens,
            }
            chunks.append(json.dumps({"choices": [], "usage": usage}))
        elif mode == "spec metrics":  # vllm serve --per-request-spec-decode-metrics summary: on the usage chunk
            metrics = {"speculative_decoding": {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.375}}
            usage = json.loads(chunks[-1])["usage"]
            chunks.append(json.dumps({"choices": [], "usage": usage, "metrics": metrics}))
        elif mode != "no usage":
            chunks.append(json.dumps({"choices": [], "usage": json.loads(chunks[-1])["usage"]}))
        if mode == "text after finish":  # text once the answer has finished, before [DONE]
            more = {"model": MODEL, "choices": [{"index": 0, "text": " more", "finish_reason": None}]}
            chunks.append(json.dumps(more))
        return [*chunks, "[DONE]"]
