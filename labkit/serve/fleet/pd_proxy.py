"""The lab's proxy in front of a prefill server and a decode server, and what the split does to the streams.

``proxy`` (a ``Proxy``): each request whose plan (``vllm.disagg.plan``, the reference of the learner's exercise)
says so is prefilled with ``max_tokens=1`` on one server, then streamed from the other, which loads the prompt's
KV through vLLM's connector (``vllm.disagg``: the connector settings, the KV files, loaded or recomputed). A failed
prefill: decode alone, counted; a failed decode: 502.

What the split does to the streams (their inter-token gaps while a burst of long prompts arrives, against one plain
server) is notebook 12's run, ``lessons.nb12.runs.itl_rounds``, on ``client.burst``.

A router in front of servers is fleet's subject: the proxy is one, with a routing rule of its own.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from ...core.checks import positive
from ...core.timing import clock
from ..launch import BackgroundApp
from ..vllm.disagg import ROUTES, plan


# ---------------------------------------------------------------------------------------- the proxy


def _usage_cached(msg: Mapping[str, Any]) -> int | None:
    return ((msg.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")


class Proxy:
    """The lab's proxy in front of a prefill and a decode server (see ``proxy``). ``records``: one dict per request
    (route, prompt tokens, prefill seconds, decode TTFT and seconds, cached tokens the decode server reported,
    fallback and its reason, status); ``fallbacks``: requests that went on with decode alone after a failed prefill."""

    def __init__(self, prefill_url: str, decode_url: str, threshold: int,
                 decide: Callable[[int, int, bool], Sequence[str]] = plan, timeout_s: float = 120.0,
                 prefill_timeout_s: float = 60.0, retry_prefill_s: float = 5.0,
                 count_tokens: Callable[[str], int] | None = None) -> None:
        positive("threshold", threshold)
        for name, value in (("timeout_s", timeout_s), ("prefill_timeout_s", prefill_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name}={value!r}: a positive number of seconds (every request has a deadline)")
        self.prefill_url, self.decode_url = prefill_url.rstrip("/"), decode_url.rstrip("/")
        self.threshold, self.decide, self.count_tokens = threshold, decide, count_tokens
        self.timeout_s, self.prefill_timeout_s, self.retry_prefill_s = timeout_s, prefill_timeout_s, retry_prefill_s
        self.records: list[dict[str, Any]] = []
        self.fallbacks, self._prefill_down_until, self._app = 0, 0.0, None

    @property
    def prefill_up(self) -> bool:
        """False for ``retry_prefill_s`` after a prefill failed; then the next long prompt tries it again."""
        return clock() >= self._prefill_down_until

    def start(self) -> "Proxy":
        self._app = BackgroundApp(self._make_app)
        return self

    url = property(lambda self: self._app.url if self._app is not None else "")

    def stop(self) -> None:
        if self._app is not None:
            self._app.stop()

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc: Any) -> None:  # the end of ``with proxy(...)``
        self.stop()

    def summary(self) -> dict[str, Any]:
        """Requests by route, fallbacks, and the median prefill seconds and decode TTFT of each route."""
        out: dict[str, Any] = {"requests": len(self.records), "fallbacks": self.fallbacks}
        for route in ("split", "decode"):
            rows = [r for r in self.records if r["route"] == route]
            out[f"{route}_requests"] = len(rows)
            for key in ("prefill_s", "decode_ttft_s"):
                values = [r[key] for r in rows if r[key] is not None]
                out[f"{route}_{key}_p50"] = statistics.median(values) if values else None
        return out

    # ------------------------------------------------------------------------------ the app

    def _make_app(self) -> Any:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)

        async def session_ctx(app_: Any) -> Any:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=5))
            yield
            await self._session.close()

        app.cleanup_ctx.append(session_ctx)
        return app

    async def _health(self, _request: Any) -> Any:
        return web.Response(text="ok")

    async def _models(self, _request: Any) -> Any:
        try:
            async with self._session.get(self.decode_url + "/v1/models", timeout=_timeout(10)) as resp:
                return web.Response(status=resp.status, body=await resp.read(), content_type="application/json")
        except Exception as exc:  # noqa: BLE001  any failure of the decode server is the proxy's 502
            return _fail(f"decode server at {self.decode_url} did not list its models: {_why(exc)}", {})

    async def _prompt_tokens(self, body: Mapping[str, Any]) -> int:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            if len(prompt) < 2:  # the ExampleConnector looks up a negative token count for it: vLLM's engine dies
                raise ValueError(f"a prompt of {len(prompt)} token ids: send 2 or more (a one-token prompt kills the "
                                 "engine of a vLLM server with the ExampleConnector)")
            return len(prompt)
        if not isinstance(prompt, str):
            raise ValueError("the proxy routes one prompt per request: send 'prompt' as a string or a list of token ids")
        if self.count_tokens is not None:
            return int(self.count_tokens(prompt))
        ask = {"prompt": prompt, **({"model": body["model"]} if "model" in body else {})}
        async with self._session.post(self.decode_url + "/tokenize", json=ask, timeout=_timeout(10)) as resp:
            return int((await resp.json())["count"]) if resp.status == 200 else 0

    async def _completions(self, request: Any) -> Any:
        rec: dict[str, Any] = dict.fromkeys(("route", "prompt_tokens", "prefill_s", "decode_ttft_s", "decode_s",
                                             "cached_tokens", "reason", "status")) | {"fallback": False}
        self.records.append(rec)
        try:
            body = await request.json()
            rec["prompt_tokens"] = await self._prompt_tokens(body)
        except Exception as exc:  # noqa: BLE001  a body the proxy cannot read is the client's error
            rec["status"], rec["reason"] = 400, _why(exc)
            return web.json_response({"error": {"message": rec["reason"]}}, status=400)
        try:
            route = list(self.decide(rec["prompt_tokens"], self.threshold, self.prefill_up))
        except Exception as exc:  # noqa: BLE001  the learner's plan failing is named, not swallowed
            route = [f"raised {_why(exc)}"]
        if route not in ROUTES:
            rec["status"] = 500
            rec["reason"] = f"the plan returned {route!r}: return ['prefill', 'decode'] or ['decode']"
            return web.json_response({"error": {"message": rec["reason"]}}, status=500)
        rec["route"] = "split" if route[0] == "prefill" else "decode"
        if rec["route"] == "split":
            await self._prefill(body, rec)
        return await self._decode(request, body, rec)

    async def _prefill(self, body: Mapping[str, Any], rec: dict[str, Any]) -> None:
        one = {k: v for k, v in body.items() if k != "stream_options"} | {"max_tokens": 1, "stream": False}
        t0 = clock()
        try:
            async with self._session.post(self.prefill_url + "/v1/completions", json=one,
                                          timeout=_timeout(self.prefill_timeout_s)) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"status {resp.status}")
            rec["prefill_s"] = clock() - t0
        except Exception as exc:  # noqa: BLE001  any prefill failure: decode alone recomputes the prompt
            self.fallbacks += 1
            self._prefill_down_until = clock() + self.retry_prefill_s
            rec["fallback"], rec["reason"] = True, f"prefill server at {self.prefill_url} failed: {_why(exc)}"

    async def _decode(self, request: Any, body: Mapping[str, Any], rec: dict[str, Any]) -> Any:
        t0 = clock()
        try:
            resp = await self._session.post(self.decode_url + "/v1/completions", json=body)
        except Exception as exc:  # noqa: BLE001  nothing answered: the proxy's 502
            rec["status"] = 502
            return _fail(f"decode server at {self.decode_url} failed: {_why(exc)}", rec)
        try:
            if resp.status >= 500:
                rec["status"] = 502
                first = (await resp.text()).strip().splitlines()[:1]
                return _fail(f"decode server at {self.decode_url} answered {resp.status}: {''.join(first)[:200]}", rec)
            if not body.get("stream") or resp.status != 200:  # a 4xx is the client's: passed on as it is
                data = await resp.read()
                rec["decode_s"], rec["status"] = clock() - t0, resp.status
                with contextlib.suppress(ValueError, AttributeError):
                    rec["cached_tokens"] = _usage_cached(json.loads(data))
                return web.Response(status=resp.status, body=data, content_type=resp.content_type)
            out = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await out.prepare(request)
            rec["status"] = 200
            try:
                async for line in resp.content:  # one SSE line at a time, passed on as it comes
                    if rec["decode_ttft_s"] is None and line.startswith(b"data:"):
                        rec["decode_ttft_s"] = clock() - t0
                    if b"prompt_tokens_details" in line:
                        with contextlib.suppress(ValueError, AttributeError):
                            rec["cached_tokens"] = _usage_cached(json.loads(line[5:]))
                    await out.write(line)
            except Exception as exc:  # noqa: BLE001  cut off mid-stream: the client gets an error event
                rec["reason"] = f"decode stream from {self.decode_url} broke: {_why(exc)}"
                with contextlib.suppress(Exception):
                    await out.write(b"data: " + json.dumps({"error": {"message": rec["reason"]}}).encode() + b"\n\n")
            rec["decode_s"] = clock() - t0
            with contextlib.suppress(Exception):
                await out.write_eof()
            return out
        finally:
            resp.release()


def _timeout(seconds: float) -> Any:
    return aiohttp.ClientTimeout(total=seconds, sock_connect=min(5.0, seconds))


def _why(exc: BaseException) -> str:
    text = "timed out" if isinstance(exc, asyncio.TimeoutError) else (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"[:240] if text else type(exc).__name__


def _fail(reason: str, rec: dict[str, Any]) -> Any:
    rec["reason"] = reason
    return web.json_response({"error": {"message": reason}}, status=502)


def proxy(prefill_url: str, decode_url: str, threshold: int, decide: Callable[[int, int, bool], Sequence[str]] = plan,
          **options: Any) -> Proxy:
    """The lab's proxy, started (``Proxy``'s options: ``timeout_s``, ``prefill_timeout_s``, ``retry_prefill_s``,
    ``count_tokens``); POST ``/v1/completions`` to its ``url``; ``with proxy(...) as p:`` stops it at the end."""
    return Proxy(prefill_url, decode_url, threshold, decide, **options).start()
