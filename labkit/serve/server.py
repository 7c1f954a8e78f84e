"""The lab's OpenAI-compatible server (aiohttp): ``/v1/completions`` and ``/v1/chat/completions``, streamed
or not, ``/health``, ``/metrics`` and ``POST /flush_cache`` (SGLang's name: drop the prefix cache's entries, as a
router's ``/flush_cache`` asks every worker to). ``Server`` validates each request (``protocol``), hands it to a batcher
(dynamic or continuous, as ``ServerConfig.batching`` says) and streams its tokens back as they come. A request
with a ``response_format`` has its grammar compiled (once per schema, ``decoding.grammar.GrammarCache``) off the event
loop before it queues; /metrics counts the compiles, the cache hits and the seconds spent compiling.
``load_model`` loads the model it serves; ``tiny_random_model`` gives tests one without files.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any

from ..core.timing import clock
from ..model import models
from ..decoding import grammar as structured
from .batchers import Batcher, ContinuousBatcher, Job, log
from .metrics import Metrics
from .protocol import TINY_RANDOM, ApiError, Params, ServerConfig, StopText, parse_body


def tiny_random_model():
    """A 2-layer random Llama with the default tokenizer: the server path in milliseconds, for tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = models.load_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    return models.Loaded(model=model, tokenizer=tok, name=TINY_RANDOM, dtype="fp32", device="cpu", load_seconds=0.0)


def load_model(model: Any = None, dtype: str = "fp32"):
    """A ``models.Loaded``: pass one through, build the tiny random model, or load by name."""
    if isinstance(model, models.Loaded):
        return model
    if model == TINY_RANDOM:
        return tiny_random_model()
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model={model!r}: pass a models.Loaded, a name/directory, '{TINY_RANDOM}' or None")
    return models.load(model, dtype=dtype)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None):
    from aiohttp import web

    return web.json_response(data, status=status, headers=headers, dumps=lambda d: json.dumps(d, ensure_ascii=False))


def _error(exc: ApiError):
    headers = {"Retry-After": "1"} if exc.status == 503 else None
    return _json(exc.body(), status=exc.status, headers=headers)


def _forget_handler_chains() -> None:
    """aiohttp caches each request handler's middleware chain (an lru_cache keyed by the handler, a bound
    method of this server), which would keep every stopped server, and the model it served, alive. Clear
    it once a server stops; running servers rebuild their entry on their next request."""
    web_app = sys.modules.get("aiohttp.web_app")
    cache = getattr(web_app, "_cached_build_middleware", None)
    if cache is not None and hasattr(cache, "cache_clear"):
        cache.cache_clear()


class Server:
    """The aiohttp application around a ``Batcher`` (``ContinuousBatcher`` when ``cfg.batching`` is continuous). Start and stop it inside one event loop."""

    def __init__(self, lm: Any, cfg: ServerConfig) -> None:
        self.lm = lm
        self.cfg = cfg
        self.metrics = Metrics()
        batcher = ContinuousBatcher if cfg.batching == "continuous" else Batcher  # one server, two loops
        self.batcher = batcher(lm, cfg, self.metrics)
        self.url: str | None = None
        self.closing = False
        self._runner: Any = None
        self._stopped: asyncio.Event | None = None
        cfg_len = getattr(lm.model.config, "max_position_embeddings", None) or 4096
        self.max_model_len = int(cfg_len)
        self.grammars: structured.GrammarCache | None = None  # built at the first response_format request

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> str:
        from aiohttp import web

        app = web.Application(client_max_size=self.cfg.max_body_bytes, middlewares=[self._errors_middleware()])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_post("/flush_cache", self.flush_cache)
        self._stopped = asyncio.Event()
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=self.cfg.drain_s + 5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        await site.start()
        self.batcher.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        return self.url

    def request_stop(self) -> None:
        if self._stopped is not None:
            self._stopped.set()

    async def serve_until_stopped(self) -> None:
        assert self._stopped is not None, "start() first"
        await self._stopped.wait()
        await self.stop()

    async def stop(self) -> None:
        """Queued requests get 503, running ones may finish for drain_s, then the port closes."""
        if self.closing:
            return
        self.closing = True
        self.batcher.close()
        if not await asyncio.to_thread(self.batcher.join, self.cfg.drain_s):
            self.batcher.abort()
            await asyncio.to_thread(self.batcher.join, 60.0)
        if self._runner is not None:
            await self._runner.cleanup()
        _forget_handler_chains()


    # ----------------------------------------------------------------- handlers
    def _errors_middleware(self):
        from aiohttp import web

        @web.middleware
        async def errors(request: Any, handler: Any) -> Any:
            try:
                return await handler(request)
            except ApiError as exc:
                return _error(exc)
            except web.HTTPException as exc:
                if exc.status < 400:
                    raise
                return _error(ApiError(exc.status, f"{exc.reason}: {request.method} {request.path}"))
            except Exception as exc:  # a bug must still answer in JSON, and the server goes on
                log.exception("unhandled error on %s", request.path)
                return _error(ApiError(500, f"internal error: {type(exc).__name__}"))
        return errors

    async def health(self, request: Any) -> Any:
        status = 503 if self.closing else 200
        max_batch_size, max_wait_ms = self.batcher.settings()
        return _json({"status": "shutting down" if self.closing else "ok", "model": self.lm.name,
                      "queue_depth": self.batcher.depth, "running": self.batcher.running,
                      "max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms}, status=status)

    async def list_models(self, request: Any) -> Any:
        return _json({"object": "list", "data": [{"id": self.lm.name, "object": "model", "owned_by": "labkit",
                                                  "max_model_len": self.max_model_len}]})

    async def metrics_endpoint(self, request: Any) -> Any:
        from aiohttp import web

        max_batch_size, max_wait_ms = self.batcher.settings()
        gauges = {"labkit_queue_depth": ("Requests waiting for a batch", self.batcher.depth),
                  "labkit_queue_capacity": ("Queue bound; beyond it requests get 503", self.cfg.max_queue),
                  "labkit_running_requests": ("Requests in the batch now running", self.batcher.running),
                  "labkit_max_batch_size": ("Configured max_batch_size", max_batch_size),
                  "labkit_max_wait_seconds": ("Configured max wait", max_wait_ms / 1e3)}
        gauges.update(self.batcher.gauges())
        counters = {**self.batcher.counters(), **self._grammar_counters()}
        return web.Response(text=self.metrics.render(gauges, counters), content_type="text/plain",
                            headers={"X-Prometheus-Format": "0.0.4"})

    def _grammar_counters(self) -> dict[str, tuple[str, float]]:
        g = self.grammars
        if g is None:
            return {}
        return {"labkit_grammar_compiles_total": ("response_format grammars compiled (cache misses)", g.misses),
                "labkit_grammar_cache_hits_total": ("response_format grammars reused from the cache", g.hits),
                "labkit_grammar_compile_seconds_total": ("Seconds spent compiling grammars", g.compile_s_total)}

    def _compile(self, fmt: structured.ResponseFormat) -> structured.Grammar:
        """The grammar of ``fmt`` for the served tokenizer (a worker thread runs this: compiling takes a while)."""
        if self.grammars is None:
            config = self.lm.model.config
            vocab = getattr(config, "vocab_size", None) or len(self.lm.tokenizer)
            self.grammars = structured.grammars(self.lm.tokenizer, int(vocab))
        return self.grammars.compile(fmt)

    async def _grammar(self, p: Params) -> structured.Grammar | None:
        if p.response_format is None:
            return None
        try:
            return await asyncio.to_thread(self._compile, p.response_format)
        except ValueError as exc:
            param = "response_format" + (".json_schema.schema" if p.response_format.kind == "json_schema" else "")
            raise ApiError(400, f"{param} cannot be compiled into a grammar (xgrammar: {exc}); fix or simplify "
                                "the schema", param) from None
        except RuntimeError as exc:  # xgrammar is not installed here
            raise ApiError(400, f"response_format: structured outputs are not available on this server ({exc})",
                           "response_format") from None

    async def flush_cache(self, request: Any) -> Any:
        """Drop the prefix cache's entries (its counters go on): between two experiments on one server."""
        cache = getattr(self.batcher, "prefix_cache", None)
        if cache is None:
            return _json({"flushed": 0, "message": "no prefix cache on this server (--batching continuous "
                                                   "--prefix-cache-tokens N turns one on)"})
        return _json({"flushed": cache.clear(), "message": "prefix cache flushed"})

    async def completions(self, request: Any) -> Any:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Any) -> Any:
        return await self._generate(request, chat=True)

    async def _read(self, request: Any) -> bytes:
        from aiohttp import web

        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, f"request body is larger than {self.cfg.max_body_bytes} bytes") from None

    def _prompt_ids(self, p: Params) -> list[int]:
        tok = self.lm.tokenizer
        if p.chat:
            if getattr(tok, "chat_template", None):
                # transformers 5 returns a BatchEncoding unless return_dict=False
                ids = tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            else:
                ids = tok("\n".join(m["content"] for m in p.messages or []))["input_ids"]
        elif p.prompt_ids is not None:
            ids = p.prompt_ids
            bad = next((i for i in ids if not 0 <= i < len(tok)), None)
            if bad is not None:
                raise ApiError(400, f"'prompt' holds token id {bad}, outside this model's vocabulary of {len(tok)} "
                                    "(tokenise with the served model's tokenizer)", "prompt")
        else:
            ids = tok(p.prompt)["input_ids"]
        ids = [int(i) for i in ids]
        param = "messages" if p.chat else "prompt"
        if not ids:
            raise ApiError(400, f"'{param}' is empty: send at least one token of text", param)
        if len(ids) > self.cfg.max_prompt_tokens:
            raise ApiError(400, f"'{param}' has {len(ids)} tokens; this server accepts at most "
                           f"{self.cfg.max_prompt_tokens} (shorten it)", param)
        if len(ids) + p.max_tokens > self.max_model_len:
            raise ApiError(400, f"prompt ({len(ids)} tokens) + max_tokens ({p.max_tokens}) exceeds the model's "
                           f"context of {self.max_model_len} tokens; lower max_tokens", "max_tokens")
        return ids

    async def _generate(self, request: Any, chat: bool) -> Any:
        endpoint = "chat" if chat else "completions"
        try:
            params = parse_body(await self._read(request), chat, self.cfg)
            prompt_ids = self._prompt_ids(params)
            job = Job(prompt_ids, params, asyncio.get_running_loop())  # arrival stamped: TTFT includes the compile
            job.grammar = await self._grammar(params)
            self.batcher.submit(job)
        except ApiError as exc:
            self.metrics.count(endpoint, exc.status)
            return _error(exc)
        self.metrics.add_tokens(prompt=len(prompt_ids))
        try:
            first = await job.events.get()
            if first[0] == "error":  # nothing was sent yet: a plain error response
                self.metrics.count(endpoint, first[1])
                return _error(ApiError(first[1], first[2]))
            if params.stream:
                return await self._stream(request, job, first, endpoint)
            return await self._complete(job, first, endpoint)
        finally:
            job.cancelled = True  # no-op once it finished; stops the work if the client went away

    def _record_first(self, job: Job) -> None:
        self.metrics.observe(self.metrics.ttft, clock() - job.arrival)

    def _record_done(self, job: Job, n_out: int, endpoint: str, status: int) -> None:
        self.metrics.observe(self.metrics.e2e, clock() - job.arrival)
        self.metrics.add_tokens(output=n_out)
        self.metrics.count(endpoint, status)

    def _envelope(self, p: Params, rid: str, chunk: bool) -> dict[str, Any]:
        obj = ("chat.completion" if p.chat else "text_completion") + (".chunk" if chunk and p.chat else "")
        return {"id": rid, "object": obj, "created": int(time.time()), "model": self.lm.name}

    def _usage(self, job: Job, n_out: int) -> dict[str, Any]:
        """OpenAI's usage, with ``prompt_tokens_details.cached_tokens``: the prompt positions the prefix cache served
        (0 without one), as vLLM reports them with ``--enable-prompt-tokens-details``."""
        cached = job.seq.cached_tokens if job.seq is not None else 0
        return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": n_out,
                "total_tokens": len(job.prompt_ids) + n_out, "prompt_tokens_details": {"cached_tokens": cached}}

    async def _complete(self, job: Job, event: tuple[Any, ...], endpoint: str) -> Any:
        self._record_first(job)
        answer = StopText(self.lm.tokenizer, job.params.stop)
        parts: list[str] = []
        n_out = 0
        while True:
            if event[0] == "error":
                self._record_done(job, n_out, endpoint, event[1])
                return _error(ApiError(event[1], event[2]))
            n_out += 1
            parts.append(answer.add(event[1]))
            if answer.stopped:  # a stop string completed: the model thread drops the sequence at its next step
                job.cancelled = True
                reason = "stop"
                break
            if event[2] is not None:
                reason = event[2]
                parts.append(answer.finish())
                break
            event = await job.events.get()
        p, text = job.params, "".join(parts)
        rid = ("chatcmpl-" if p.chat else "cmpl-") + uuid.uuid4().hex[:24]
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if p.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        self._record_done(job, n_out, endpoint, 200)
        return _json({**self._envelope(p, rid, False), "choices": [choice], "usage": self._usage(job, n_out)})

    async def _stream(self, request: Any, job: Job, event: tuple[Any, ...], endpoint: str) -> Any:
        from aiohttp import web

        p = job.params
        rid = ("chatcmpl-" if p.chat else "cmpl-") + uuid.uuid4().hex[:24]
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache"})
        await resp.prepare(request)
        answer = StopText(self.lm.tokenizer, p.stop)
        n_out, status = 0, 200

        async def send(data: Any) -> None:
            payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
            await resp.write(f"data: {payload}\n\n".encode("utf-8"))

        self._record_first(job)
        try:
            while True:
                if event[0] == "error":
                    status = event[1]
                    await send(ApiError(event[1], event[2]).body())
                    break
                n_out += 1
                delta = answer.add(event[1])
                reason = "stop" if answer.stopped else event[2]
                if answer.stopped:
                    job.cancelled = True  # the model thread drops the sequence at its next step
                elif reason is not None:
                    delta += answer.finish()
                if p.chat:
                    d = {"role": "assistant", "content": delta} if n_out == 1 else {"content": delta}
                    choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": reason}
                else:
                    choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason}
                if p.return_token_ids:
                    choice["token_ids"] = [int(event[1])]
                await send({**self._envelope(p, rid, True), "choices": [choice]})
                if reason is not None:
                    break
                event = await job.events.get()
            if p.include_usage and status == 200:
                await send({**self._envelope(p, rid, True), "choices": [], "usage": self._usage(job, n_out)})
            await send("[DONE]")
            await resp.write_eof()
        except ConnectionError:  # the client went away mid-stream; the finally in _generate cancels the job
            status = 499
        self._record_done(job, n_out, endpoint, status)
        return resp
