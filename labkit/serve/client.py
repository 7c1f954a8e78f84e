"""One request to an OpenAI-compatible server (labkit's, ``vllm serve``, a router, a proxy), as its client sees it.

``endpoint_url``          a server's completions or chat URL (any other endpoint refused, naming the two)
``payload``               a greedy streaming body for the completions or chat endpoint (text or token ids)
``send_request``          the one streaming client: every chunk stamped on arrival (``chunk_s``), TTFT and the gaps
                          between chunks (ITL, through ``timing.gaps``) from those stamps, its text and token ids
``burst_while_streaming`` prompts sent while others decode (chunked prefill, prefill/decode split)
``send_ids``              token-id prompts streamed, at most N in flight, each to its model and with its cache salt
``send_each``             bodies streamed one after another, each after the last answer, each with its own headers
``burst``                 ``burst_while_streaming`` from synchronous code, answered as one ``Burst`` record
``discover_model``        the model a server lists at /v1/models
``post_json``             one non-streaming POST and its JSON answer; ``post_all``, several sent at once
``run_sync``              any of these from synchronous code, a notebook's cell included

The load (arrivals, runs, SLOs, summaries, Locust) is ``loadgen``'s; this module sends one request at a time.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..core.checks import positive
from ..core.timing import clock, gaps

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def endpoint_url(base_url: str, endpoint: str) -> str:
    """The URL of ``endpoint`` ("completions" or "chat") on the server at ``base_url``; ``ValueError`` naming the
    choices for any other."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint={endpoint!r}: choose one of {sorted(ENDPOINTS)}")
    return base_url.rstrip("/") + ENDPOINTS[endpoint]


@dataclass
class RequestOutput:
    """One request as the client saw it (seconds)."""

    success: bool = False
    output_tokens: int = 0
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float = 0.0
    start_s: float = 0.0  # when it was sent, from the benchmark's start
    status: int | None = None
    error: str = ""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)  # the answer's ids, where the server sends them
    headers: dict[str, str] = field(default_factory=dict)  # response headers asked for (a router's choice of worker)
    chunk_s: list[float] = field(default_factory=list)  # each content chunk's arrival, seconds from the run's start
    prompt_tokens: int | None = None  # the prompt's length, as the server's usage counts it
    cached_tokens: int | None = None  # prompt positions its prefix cache served (usage.prompt_tokens_details), if it says

    @property
    def tpot_s(self) -> float | None:
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None


Prompt = str | Sequence[int]  # text, or token ids (already chat-formatted: sent as they are)


def payload(endpoint: str, prompt: Prompt, model: str | None, max_tokens: int, ignore_eos: bool,
            return_token_ids: bool = False, cache_salt: str | None = None) -> dict[str, Any]:
    """A greedy streaming request body for ``endpoint`` ("completions" or "chat"): ``prompt`` as text, or as token
    ids (completions only); usage in the last chunk; vLLM's ``ignore_eos``, ``return_token_ids`` and ``cache_salt``
    when asked."""
    body: dict[str, Any] = {"temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if not isinstance(prompt, str):  # token ids: the completions endpoint takes them as the prompt, untokenised
        if endpoint != "completions":
            raise ValueError(f"token-id prompts go to endpoint 'completions', not {endpoint!r}: the chat endpoint "
                             "takes messages")
        body.update(prompt=[int(i) for i in prompt], max_tokens=max_tokens)
    elif endpoint == "chat":
        body.update(messages=[{"role": "user", "content": prompt}], max_completion_tokens=max_tokens)
    else:
        body.update(prompt=prompt, max_tokens=max_tokens)
    if ignore_eos:
        body["ignore_eos"] = True  # a vLLM extension: exactly max_tokens tokens
    if return_token_ids:
        body["return_token_ids"] = True  # a vLLM extension: each chunk carries its token ids
    if cache_salt is not None:
        body["cache_salt"] = cache_salt  # a vLLM extension: blocks hashed under another salt are never shared
    return body


async def sse_messages(resp: Any) -> AsyncIterator[dict[str, Any] | None]:
    """The JSON messages of an OpenAI-style event stream (``aiohttp`` response), one per ``data:`` line, then
    ``None`` for the closing ``[DONE]``: a stream that stops without it was cut off."""
    async for raw in resp.content:  # one SSE line at a time
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            yield None
            return
        yield json.loads(data)


async def send_request(session: Any, url: str, payload: dict[str, Any], chat: bool, t0: float,
                       headers: dict[str, str] | None = None, keep_headers: Sequence[str] = (),
                       on_chunk: Callable[[int], None] | None = None) -> RequestOutput:
    """POST one streaming request: the one streaming client. It stamps every chunk (``chunk_s``, from ``t0``; TTFT
    and ITL from them) and keeps its text and token ids. ``headers`` go with the request (a router's routing key);
    the response headers named in ``keep_headers`` are kept; ``on_chunk(n)`` is called after the n-th chunk."""
    import aiohttp

    out = RequestOutput()
    start = clock()
    out.start_s = start - t0
    last = start
    chunks = 0
    finished = False  # the server's closing [DONE]: a stream cut off before it is a failed request
    parts: list[str] = []
    try:
        async with session.post(url, json=payload, headers=headers) as resp:
            out.status = resp.status
            out.headers = {name: resp.headers[name] for name in keep_headers if name in resp.headers}
            if resp.status != 200:
                out.error = (await resp.text())[:300]
                return out
            async for msg in sse_messages(resp):
                if msg is None:
                    finished = True
                    break
                if "error" in msg:
                    out.error = str(msg["error"].get("message", msg["error"]))[:300]
                    return out
                stamp = clock()
                if msg.get("choices"):
                    choice = msg["choices"][0]
                    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if chunks == 0:
                        out.ttft_s = stamp - start
                    last = stamp
                    chunks += 1
                    out.chunk_s.append(stamp - t0)
                    parts.append(text or "")
                    out.token_ids.extend(int(t) for t in choice.get("token_ids") or ())
                    if on_chunk is not None:
                        on_chunk(chunks)
                if msg.get("usage"):
                    usage = msg["usage"]
                    out.output_tokens = int(usage.get("completion_tokens") or 0)
                    out.prompt_tokens = usage.get("prompt_tokens")
                    out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        out.e2e_s = last - start
        out.itl_s = gaps(out.chunk_s)
        out.output_tokens = out.output_tokens or chunks
        out.text = "".join(parts)
        out.success = chunks > 0 and finished
        if not chunks:
            out.error = "the stream ended without a token"
        elif not finished:
            out.error = f"the stream was cut off after {chunks} chunks, before [DONE] (the server closed it)"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    return out


async def burst_while_streaming(session: Any, url: str, stream_payloads: Sequence[dict[str, Any]],
                                burst_payloads: Sequence[dict[str, Any]], *, chat: bool, after: int,
                                timeout_s: float) -> tuple[list[RequestOutput], list[RequestOutput], float]:
    """Prompts arriving while others decode, for any server: the streams start together; once the first has
    received ``after`` chunks (or ended early) the burst is sent, all at once. (streams, burst, when the burst was
    sent), every chunk stamped from one clock (``chunk_s``, ``start_s``, seconds from the streams' start)."""
    t0, seen = clock(), asyncio.Event()

    def first(n: int) -> None:
        if n >= after:
            seen.set()

    async def stream(i: int, body: dict[str, Any]) -> RequestOutput:
        try:
            return await send_request(session, url, body, chat, t0, on_chunk=first if i == 0 else None)
        finally:
            if i == 0:
                seen.set()  # a stream that ended early must not leave the burst waiting

    streams = [asyncio.create_task(stream(i, p)) for i, p in enumerate(stream_payloads)]
    await asyncio.wait_for(seen.wait(), timeout=timeout_s)  # the streams are decoding: now the burst comes
    sent = clock() - t0
    burst = await asyncio.gather(*(send_request(session, url, p, chat, t0) for p in burst_payloads))
    return list(await asyncio.gather(*streams)), list(burst), sent


async def discover_model(session: Any, base_url: str) -> str | None:
    """The first model the server lists at /v1/models (vLLM requires the name in every request)."""
    import aiohttp

    try:
        async with session.get(base_url.rstrip("/") + "/v1/models") as resp:
            if resp.status == 200:
                data = (await resp.json()).get("data") or []
                return data[0]["id"] if data else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
        return None
    return None


async def post_json(session: Any, url: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """One non-streaming POST: the status, the JSON answer (an error's text as ``{"error": {"message": …}}`` when
    the answer is not JSON) and the seconds it took."""
    t0 = clock()
    async with session.post(url, json=dict(body)) as resp:
        text = await resp.text()
        elapsed = clock() - t0
        try:
            data = json.loads(text)
        except ValueError:
            data = {"error": {"message": text[:300]}}
        return {"status": resp.status, "data": data, "e2e_s": elapsed}


def refusal(out: Mapping[str, Any]) -> dict[str, Any]:
    """A ``post_json`` result as a refusal reads: its status, the error's message (the body itself when it holds no
    error object) and the parameter the server named."""
    data = out["data"] if isinstance(out["data"], dict) else {"error": out["data"]}
    err = data.get("error") if isinstance(data.get("error"), dict) else {}
    return {"status": out["status"], "message": str(err.get("message", data))[:300], "param": err.get("param")}


def send_ids(base_url: str, prompts: Sequence[Sequence[int]], max_tokens: int, concurrency: int, *,
             models: Sequence[str | None] | None = None, salts: Sequence[str | None] | None = None,
             ignore_eos: bool = True, timeout_s: float = 600.0) -> tuple[list[RequestOutput], float]:
    """Streaming completions of ``prompts`` (token ids), greedy, at most ``concurrency`` in flight; request i goes to
    ``models[i]`` (default: the model the server lists first) with cache salt ``salts[i]`` (None: no salt). Each
    answer's measurement (TTFT, ITL, E2E, its token ids) and the wall seconds of all."""
    import aiohttp

    positive("max_tokens", max_tokens)
    positive("concurrency", concurrency)
    models = list(models) if models is not None else [None] * len(prompts)
    salts = list(salts) if salts is not None else [None] * len(prompts)
    if len(models) != len(prompts) or len(salts) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts, {len(models)} model names and {len(salts)} salts: give one of each "
                         "per prompt (None: the server's model, no salt)")
    url = endpoint_url(base_url, "completions")

    async def go() -> tuple[list[RequestOutput], float]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            served = None if all(models) else await discover_model(session, base_url)
            gate, t0 = asyncio.Semaphore(concurrency), clock()

            async def one(ids: Sequence[int], model: str | None, salt: str | None) -> RequestOutput:
                body = payload("completions", list(ids), model or served, max_tokens, ignore_eos,
                               return_token_ids=True, cache_salt=salt)
                async with gate:
                    return await send_request(session, url, body, False, t0)

            outs = list(await asyncio.gather(*(one(p, m, s) for p, m, s in zip(prompts, models, salts))))
            return outs, clock() - t0

    return run_sync(go)


def send_each(base_url: str, bodies: Sequence[Mapping[str, Any]], *, headers: Sequence[Mapping[str, str] | None] | None
              = None, keep_headers: Sequence[str] = (), endpoint: str = "completions", timeout_s: float = 600.0
              ) -> list[RequestOutput]:
    """Each streaming body sent in order, the next only once the last has answered (an agent waits for its answer
    before its next turn), on one clock; ``headers[i]`` go with body i (a router's routing key), the response headers
    named in ``keep_headers`` are kept. A body without a "model" gets the one the server lists first."""
    import aiohttp

    per = list(headers) if headers is not None else [None] * len(bodies)
    if len(per) != len(bodies):
        raise ValueError(f"{len(bodies)} bodies and {len(per)} headers: give one per body (None: no extra headers)")
    url = endpoint_url(base_url, endpoint)

    async def go() -> list[RequestOutput]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            model = None if all(b.get("model") for b in bodies) else await discover_model(session, base_url)
            outs, t0 = [], clock()
            for body, extra in zip(bodies, per):
                full = {**body, "model": body.get("model") or model}
                outs.append(await send_request(session, url, full, endpoint == "chat", t0,
                                               dict(extra) if extra else None, keep_headers))
            return outs

    return run_sync(go)


@dataclass(frozen=True)
class Burst:
    """Prompts that arrived while others streamed, as ``burst`` saw them: one shape for every experiment that sends
    them (chunked prefill on the lab's server and on vLLM, long prompts against the prefill/decode split). Every
    time is seconds from the streams' start, on the clock of each ``RequestOutput.chunk_s``."""

    streams: tuple[RequestOutput, ...]
    burst: tuple[RequestOutput, ...]
    sent_s: float  # when the burst was sent

    @property
    def stamps(self) -> list[list[float]]:
        """Each stream's chunk arrivals."""
        return [s.chunk_s for s in self.streams]

    @property
    def answers(self) -> list[list[int]]:
        """Each stream's token ids (where the server sends them)."""
        return [s.token_ids for s in self.streams]

    @property
    def errors(self) -> list[str]:
        """The error of every request that failed, streams first."""
        return [o.error for o in (*self.streams, *self.burst) if o.error]

    @property
    def first_token_s(self) -> float | None:
        """When the burst's last first token came (its prefill done); None where a burst request sent no token."""
        firsts = [o.chunk_s[0] for o in self.burst if o.chunk_s]
        return max(firsts) if firsts and len(firsts) == len(self.burst) else None


def burst(base_url: str, stream_prompts: Sequence[Prompt], stream_tokens: int, burst_prompts: Sequence[Prompt],
          burst_tokens: int = 1, after: int = 4, *, endpoint: str = "completions", salt: str | None = None,
          timeout_s: float = 600.0) -> Burst:
    """``burst_while_streaming`` from synchronous code: streams of ``stream_tokens`` each (``ignore_eos``), the
    burst of ``burst_tokens`` each sent after the first stream's ``after``-th chunk, every request with cache salt
    ``salt``. Prompts are text or token ids (``payload``'s rules for ``endpoint``); the model is the one the server
    lists first."""
    import aiohttp

    if not 0 < after < positive("stream_tokens", stream_tokens):
        raise ValueError(f"after={after}, stream_tokens={stream_tokens}: need 0 < after < stream_tokens, so the burst "
                         "comes while the streams are still decoding")
    positive("burst_tokens", burst_tokens)
    url = endpoint_url(base_url, endpoint)

    async def go() -> Burst:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            model = await discover_model(session, base_url)

            def body(prompt: Prompt, n: int) -> dict[str, Any]:
                return payload(endpoint, prompt, model, n, ignore_eos=True,
                               return_token_ids=endpoint == "completions", cache_salt=salt)

            streams, sent_burst, sent = await burst_while_streaming(
                session, url, [body(p, stream_tokens) for p in stream_prompts],
                [body(p, burst_tokens) for p in burst_prompts], chat=endpoint == "chat", after=after,
                timeout_s=timeout_s)
            return Burst(tuple(streams), tuple(sent_burst), sent)

    return run_sync(go)


def post_all(base_url: str, bodies: Sequence[Mapping[str, Any]], *, endpoint: str = "chat",
             timeout_s: float = 300.0) -> tuple[float, list[dict[str, Any]]]:
    """Every body POSTed to ``endpoint`` at once, not streamed; a body without a "model" gets the one the server
    lists first. (The wall seconds from the first send to the last answer, each ``post_json`` result in order.)"""
    import aiohttp

    url = endpoint_url(base_url, endpoint)

    async def go() -> tuple[float, list[dict[str, Any]]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            model = None if all(b.get("model") for b in bodies) else await discover_model(session, base_url)
            full = [{**b, "model": b.get("model") or model} for b in bodies]
            t0 = clock()
            outs = await asyncio.gather(*(post_json(session, url, b) for b in full))
            return clock() - t0, list(outs)

    return run_sync(go)


def run_sync(coro_fn: Callable[[], Any]) -> Any:
    """``coro_fn()``'s coroutine run to its end from synchronous code, also inside Jupyter (whose event loop is
    already running: then on a fresh loop in a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(coro_fn())).result()
