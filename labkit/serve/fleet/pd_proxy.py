"""The lab's proxy in front of a prefill server and a decode server, and what the split does to the streams.

``proxy`` (a ``Proxy``): each request whose plan (``vllm.disagg.plan``, the reference of the learner's exercise)
says so is prefilled with ``max_tokens=1`` on one server, then streamed from the other, which loads the prompt's
KV through vLLM's connector (``vllm.disagg``: the connector settings, the KV files, loaded or recomputed). A failed
prefill: decode alone, counted; a failed decode: 502.

``itl_rounds``: the short streams' inter-token gaps while a burst of long prompts arrives, on each target (one
plain server, the split pair behind the proxy) in interleaved rounds, judged by ``verdict``.

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

from ...core import verdict
from ...core.checks import positive
from ...core.timing import clock, percentile, pooled_gaps, rounds as interleaved_rounds
from .. import client
from ..experiments import prefill
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


# ---------------------------------------------------------------------------------------- ITL under a burst


def salted(prompt: Sequence[int], k: int) -> list[int]:
    """``prompt`` with its first token replaced by one of its own per ``k``: no cache, local or on disk, holds it."""
    return [1000 + k, *list(prompt)[1:]]


def burst_while_streaming(base_url: str, stream_prompts: Sequence[Sequence[int]], stream_tokens: int,
                          long_prompts: Sequence[Sequence[int]], long_tokens: int = 1, long_after: int = 4,
                          timeout_s: float = 300.0) -> dict[str, Any]:
    """Streams decoding ``stream_tokens`` each; after the first stream's ``long_after``-th chunk the long prompts
    arrive at once (``client.burst_ids`` checks that they come while the streams still decode). Every stream's chunk
    stamps, and when the burst was sent and its last first token came."""
    streams, longs, sent = client.burst_ids(base_url, stream_prompts, stream_tokens, long_prompts, long_tokens,
                                            long_after, None, timeout_s)
    firsts = [o.chunk_s[0] for o in longs if o.chunk_s]
    return {"stamps": [s.chunk_s for s in streams], "answers": [s.token_ids for s in streams],
            "burst_sent_s": sent, "burst_done_s": max(firsts) if len(firsts) == len(longs) else None,
            "errors": [o.error for o in [*streams, *longs] if o.error]}


def itl_rounds(targets: Mapping[str, str], stream_prompts: Sequence[Sequence[int]], stream_tokens: int,
               long_prompt: Sequence[int], n_long: int, n_rounds: int, long_after: int = 4) -> list[dict[str, Any]]:
    """The short streams' inter-token gaps while a burst of ``n_long`` long prompts arrives, on each of ``targets``
    (name → base URL) in turn, ``n_rounds`` interleaved rounds; the first target is the baseline each other is
    judged against (``verdict.compare`` on each round's stall, the longest gap overlapping the burst's prefill,
    lower is better: a p90 gap misses two stalls among sixty gaps). Every long prompt is ``salted`` apart.

    The comparison this lab makes on two cores: the baseline is one plain ``vllm serve`` (no connector) on core 0
    taking everything; "split" is the proxy in front of a prefill server on core 1 and a decode server on core 0.
    Both keep the streams on core 0; the split adds the core that absorbs the long prompts' prefill, which is
    what disaggregation buys. A same-hardware baseline is one server on cores 0-1: pass it as the first target."""
    positive("n_long", n_long), positive("n_rounds", n_rounds)
    if not targets:
        raise ValueError("targets={}: name at least a baseline and one other server (name → base URL)")
    counter = iter(range(10**6))

    def one(url: str) -> dict[str, Any]:
        longs = [salted(long_prompt, next(counter)) for _ in range(n_long)]
        return burst_while_streaming(url, stream_prompts, stream_tokens, longs, 1, long_after)

    done = interleaved_rounds({name: (lambda u=url: one(u)) for name, url in targets.items()}, n_rounds, again=False)
    p90 = {name: [percentile(g, 90) for r in runs if (g := pooled_gaps(r["stamps"]))] for name, runs in done.items()}
    stall = {name: [m for r in runs if r["burst_done_s"] is not None and (m := prefill.itl_stats(
        r["stamps"], (r["burst_sent_s"], r["burst_done_s"]))["max_s"]) is not None] for name, runs in done.items()}
    base, rows = next(iter(targets)), []
    for name, runs in done.items():
        itl, stalls = prefill.itl_stats([s for r in runs for s in r["stamps"]]), stall[name]
        v = (verdict.compare(stalls, stall[base], higher_is_better=False)
             if name != base and stalls and stall[base] else None)
        rows.append({"target": name, "rounds": n_rounds, "streams": len(stream_prompts), "stream_tokens": stream_tokens,
                     "long_prompts": n_long, "long_prompt_tokens": len(long_prompt), "itl_n": itl["n"],
                     "itl_p50_s": itl["p50_s"], "itl_p99_s": itl["p99_s"], "itl_max_s": itl["max_s"],
                     "itl_p90_round_p50_s": statistics.median(p90[name]) if p90[name] else None,
                     "stall_p50_s": statistics.median(stalls) if stalls else None,
                     "verdict": v.kind if v else ("baseline" if name == base else "not measured"),
                     "gain": v.gain if v else None, "verdict_reason": v.reason if v else "",
                     "samples": {"itl_p90_s": p90[name], "stall_s": stalls}, "answers": runs[0]["answers"],
                     "errors": [e for r in runs for e in r["errors"]][:3]})
    return rows

