"""A slowdown of known size: a streaming proxy that makes a server look ``per_token_s`` slower per token.

``SlowProxy(upstream, per_token_s)`` forwards ``/v1/completions`` and ``/v1/chat/completions`` (and passes
``/v1/models``, ``/health`` and ``/metrics`` through) and holds each stream's k-th chunk back until ``(k + 1) ×
per_token_s`` after it arrived: every gap between tokens grows by ``per_token_s`` and the first token comes
``per_token_s`` later, as from a server whose every decode step took that much longer. ``per_token_s = 0`` forwards
at once: the A side of an A/A test goes through the same proxy as its B side. ``per_token_s`` may be changed
between runs.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
from aiohttp import web

from ...core.timing import clock
from ..launch import BackgroundApp

FORWARDED = ("/v1/completions", "/v1/chat/completions")
PASSED = ("/v1/models", "/health", "/metrics")


def carries_tokens(line: bytes) -> bool:
    """Whether a server-sent-events line is a generated token's chunk: a completion choice's ``text``, empty or not
    (a token can decode to no text, past the end of an answer under ``ignore_eos``, and still took its step; vLLM
    sends its chunk all the same), or a chat delta's ``content`` that is not the role's opening chunk. Not the
    usage chunk, not ``[DONE]``."""
    if not line.startswith(b"data: {"):
        return False
    try:
        chunk = json.loads(line[6:])
    except ValueError:
        return False
    for c in chunk.get("choices") or []:
        delta = c.get("delta")
        if "text" in c and c["text"] is not None:
            return True
        if isinstance(delta, dict) and (delta.get("content") or ("content" in delta and "role" not in delta)):
            return True
    return False


class SlowProxy:
    """See the module docstring. ``url`` once started; ``stop()`` (or a ``with`` block) closes it."""

    def __init__(self, upstream: str, per_token_s: float = 0.0, timeout_s: float = 600.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.per_token_s = per_token_s
        self.timeout_s = timeout_s
        self._app = BackgroundApp(self._make_app, name="labkit-slow-proxy")
        self.url = self._app.url

    @property
    def per_token_s(self) -> float:
        return self._per_token_s

    @per_token_s.setter
    def per_token_s(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 10:
            raise ValueError(f"per_token_s={value!r}: seconds added per token, 0 (none) up to 10")
        self._per_token_s = float(value)

    def _make_app(self) -> web.Application:
        app = web.Application()
        state: dict[str, Any] = {}

        async def open_session(_app: web.Application) -> None:
            state["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

        async def close_session(_app: web.Application) -> None:
            await state["session"].close()

        async def forward(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            delay = self._per_token_s
            async with state["session"].post(self.upstream + request.path, data=body,
                                             headers={"Content-Type": "application/json"}) as up:
                if up.status != 200 or "text/event-stream" not in up.headers.get("Content-Type", ""):
                    return web.Response(status=up.status, body=await up.read(),
                                        content_type=up.headers.get("Content-Type", "application/json").split(";")[0])
                out = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                              "Cache-Control": "no-cache"})
                await out.prepare(request)
                arrivals: asyncio.Queue = asyncio.Queue()

                async def read() -> None:  # stamps each line as it arrives, however long the writer waits
                    try:
                        async for line in up.content:
                            await arrivals.put((clock(), line))
                    finally:
                        await arrivals.put(None)

                reader = asyncio.create_task(read())
                k = 0
                try:
                    while (item := await arrivals.get()) is not None:
                        arrived, line = item
                        if delay and carries_tokens(line):
                            k += 1
                            await asyncio.sleep(max(0.0, arrived + k * delay - clock()))
                        await out.write(line)
                    await out.write_eof()
                except ConnectionError:  # the client hung up (after [DONE], or gave up): nothing left to send
                    pass
                finally:
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                        await reader
                return out

        async def passthrough(request: web.Request) -> web.Response:
            async with state["session"].get(self.upstream + request.path) as up:
                return web.Response(status=up.status, body=await up.read(),
                                    content_type=up.headers.get("Content-Type", "text/plain").split(";")[0])

        app.on_startup.append(open_session)
        app.on_cleanup.append(close_session)
        for path in FORWARDED:
            app.router.add_post(path, forward)
        for path in PASSED:
            app.router.add_get(path, passthrough)
        return app

    def stop(self) -> None:
        self._app.stop()

    def __enter__(self) -> "SlowProxy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
