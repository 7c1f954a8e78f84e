"""Prefill here, decode there: two ``vllm serve`` joined by vLLM's ExampleConnector, the lab's proxy in front.

The ExampleConnector passes the KV through a directory (``shared_storage_path``): a server writes one safetensors
file per attention layer for each prompt it has no folder for (named by the hash of its first whole blocks of ids);
one that finds the folder logs "External Cache Hit!", loads it ("Inject KV cache of N tokens to the paged memory")
and computes only the rest. It reads no ``kv_role``: that only switches vLLM's scheduler book-keeping.

Here: the two servers' ``connector_settings``; ``plan``, the routing decision (the reference of the learner's
exercise); ``proxy``, which prefills with ``max_tokens=1`` on one server, then streams the request from the other
(a failed prefill: decode alone, counted; a failed decode: 502); ``kv_files`` beside ``kv_bytes_formula``;
``kv_log``, ``recomputed`` and ``transfer_metrics``, loaded or recomputed; ``itl_rounds``, split or not.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import statistics
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ...core import verdict
from ...core.checks import positive
from ...core.timing import clock, percentile, pooled_gaps, rounds as interleaved_rounds
from ...model import sizing
from ...model.dtypes import DTYPE_BYTES, normalize_dtype
from .. import client, loadgen, prefill
from ..metrics import metric_totals
from . import server as vs

CONNECTOR = "ExampleConnector"
ROLES = {"split": ("kv_producer", "kv_consumer"), "both": ("kv_both", "kv_both")}  # (prefill's, decode's) kv_role
CPU_BLOCK_SIZE = 128  # vLLM's CPU platform default block (vllm/platforms/cpu.py) when none is given
HIT_LINE = "External Cache Hit!"  # ExampleConnector.get_num_new_matched_tokens, in the scheduler's process
_INJECT = re.compile(r"Inject KV cache of (\d+) tokens to the paged memory")  # its start_load_kv, in the worker
EXTERNAL_HITS, EXTERNAL_QUERIES = "vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"  # label source: local_compute, local_cache_hit, external_kv_transfer


# ---------------------------------------------------------------------------------------- the two servers


def connector_config(role: str, storage_dir: str | Path) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for the ExampleConnector with ``kv_role`` ``role`` on ``storage_dir``."""
    return {"kv_connector": CONNECTOR, "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(storage_dir)}}


def connector_settings(base: vs.Settings, role: str, storage_dir: str | Path,
                       cores: tuple[str, str] = ("1", "0")) -> dict[str, vs.Settings]:
    """``{"prefill": …, "decode": …}``: ``base`` with the connector on ``storage_dir`` and one core each (``cores``:
    the prefill server's, the decode server's). ``role`` "split": kv_producer and kv_consumer; "both": kv_both on
    each, as vLLM's own disaggregated examples run the connector. ``--enable-prompt-tokens-details`` makes each
    answer's usage say how many prompt tokens were not computed (``cached_tokens``)."""
    if role not in ROLES:
        raise ValueError(f"role={role!r}: choose one of {sorted(ROLES)}")
    if len(cores) != 2 or not all(cores):
        raise ValueError(f"cores={cores!r}: give two core lists, the prefill server's then the decode server's")
    return {name: replace(base, cpu_cores=core, extra_args=(*base.extra_args, "--kv-transfer-config",
                                                            json.dumps(connector_config(kv_role, storage_dir)),
                                                            "--enable-prompt-tokens-details"))
            for name, kv_role, core in zip(("prefill", "decode"), ROLES[role], cores)}


def loaded_tokens(prompt_tokens: int, block_size: int = CPU_BLOCK_SIZE) -> int:
    """Prompt tokens whose KV the decode server can load after a prefill of the same prompt: the prefill stores
    ``(n - 1) // block × block`` tokens, the decode looks up ``(n - 2) // block × block`` (the connector's
    ``align_to_block_size``); 0 when those differ (n - 1 a whole number of blocks) or the prompt is under a block."""
    stored, looked_up = (prompt_tokens - 1) // block_size * block_size, (prompt_tokens - 2) // block_size * block_size
    return stored if stored == looked_up and stored > 0 else 0


def min_split_tokens(block_size: int = CPU_BLOCK_SIZE) -> int:
    """The shortest prompt whose KV can go over at all: one block and two tokens."""
    return positive("block_size", block_size) + 2


def plan(prompt_tokens: int, threshold: int, prefill_up: bool) -> list[str]:
    """The servers a request visits: ``["prefill", "decode"]`` for a prompt of ``threshold`` tokens or more while
    the prefill server is up, else ``["decode"]`` (a short prompt costs less to prefill than to hand over)."""
    return ["prefill", "decode"] if prefill_up and prompt_tokens >= threshold else ["decode"]


ROUTES = (["prefill", "decode"], ["decode"])  # what a plan may return


# ---------------------------------------------------------------------------------------- the proxy


class BackgroundApp:
    """An aiohttp app on 127.0.0.1 served from a thread of its own with its own event loop; ``stop()`` closes it."""

    def __init__(self, make_app: Callable[[], Any], startup_timeout_s: float = 10.0) -> None:
        self.loop, self._stopped, self.url = asyncio.new_event_loop(), None, ""
        ready, failure = threading.Event(), []

        async def main() -> None:
            self._stopped = asyncio.Event()
            runner = web.AppRunner(make_app(), handle_signals=False, access_log=None, shutdown_timeout=2.0)
            await runner.setup()
            try:
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                self.url = "http://127.0.0.1:%d" % runner.addresses[0][1]
                ready.set()
                await self._stopped.wait()
            finally:
                await runner.cleanup()

        def run() -> None:
            try:
                self.loop.run_until_complete(main())
            except BaseException as exc:  # noqa: BLE001  a failed start goes back to the caller
                failure.append(exc)
                ready.set()
            finally:
                self.loop.close()

        self.thread = threading.Thread(target=run, name="labkit-disagg-app", daemon=True)
        self.thread.start()
        if not ready.wait(startup_timeout_s) or failure:
            self.stop()
            raise RuntimeError(f"the app did not start: {failure[0] if failure else 'no port within the timeout'}")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.thread.is_alive() and self._stopped is not None:
            self.loop.call_soon_threadsafe(self._stopped.set)
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise RuntimeError(f"the app at {self.url} did not stop within {timeout_s:g} s")


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


# ---------------------------------------------------------------------------------------- the bytes moved


def safetensors_header_bytes(path: str | Path) -> tuple[int, dict[str, Any]]:
    """A safetensors file's header: its size in bytes (the 8-byte length and the JSON) and the JSON."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return 8 + n, json.loads(fh.read(n))


def _layer_order(path: Path) -> tuple[int, str]:
    return (int(m.group(1)) if (m := re.search(r"\.(\d+)\.", path.name)) else -1, path.name)


def kv_files(storage_dir: str | Path) -> list[dict[str, Any]]:
    """One row per request folder the connector wrote (named by the hash of the prompt's ids): its layer files
    in layer order, each file's bytes and header bytes, the tokens, shape and dtype the header gives, the total."""
    root = Path(storage_dir)
    if not root.is_dir():
        raise ValueError(f"storage_dir={str(root)!r} is not a directory: pass the connector's shared_storage_path")
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.safetensors"), key=_layer_order)
        heads = [safetensors_header_bytes(f) for f in files]
        sizes, headers = [f.stat().st_size for f in files], [n for n, _meta in heads]
        shapes = {tuple(meta.get("kv_cache", {}).get("shape", ())) for _n, meta in heads}
        dtypes = {meta.get("kv_cache", {}).get("dtype") for _n, meta in heads}
        shape = shapes.pop() if len(shapes) == 1 else None
        rows.append({"folder": folder.name, "layers": len(files), "bytes": sum(sizes), "per_layer_bytes": sizes,
                     "header_bytes": headers, "payload_bytes": sum(sizes) - sum(headers),
                     "tokens": shape[0] if shape else None, "shape": list(shape) if shape else None,
                     "dtype": dtypes.pop() if len(dtypes) == 1 else None,
                     "mtime": max((f.stat().st_mtime for f in files), default=None)})
    return rows


def kv_bytes_formula(config: Any, tokens: int, dtype_bytes: float | str) -> list[int]:
    """Bytes each KV-holding layer keeps for ``tokens`` tokens: tokens × 2 × KV heads × head_dim × bytes for a
    full-attention layer (labkit's own ``sizing.layer_caches``). ``config``: a ``sizing.ModelShape``, a model
    name or path, or a config object; ``dtype_bytes``: bytes per value, or a dtype name ("float32")."""
    positive("tokens", tokens)
    value = DTYPE_BYTES[normalize_dtype(dtype_bytes)] if isinstance(dtype_bytes, str) else dtype_bytes
    if not value > 0:
        raise ValueError(f"dtype_bytes={dtype_bytes!r}: bytes per value (4 for float32), or a dtype name")
    s = config if isinstance(config, sizing.ModelShape) else sizing.shape(config)
    return [layer.bytes(tokens, value) for layer in sizing.layer_caches(s) if layer.kind not in ("linear", "shared")]


# ---------------------------------------------------------------------------------------- loaded or recomputed


def kv_log(log_text: str) -> dict[str, Any]:
    """What a server's log says of the connector: "External Cache Hit!" lines (the scheduler found a folder) and
    the tokens of each "Inject KV cache of N tokens" (the worker loaded them)."""
    return {"hits": log_text.count(HIT_LINE), "injected_tokens": [int(n) for n in _INJECT.findall(log_text)]}


def recomputed(log_text: str) -> bool:
    """Whether the request(s) a slice of the decode server's log covers computed their prompt: True when no KV
    was injected. A hit line alone does not count: a prompt under one block finds the folder of zero tokens,
    logs the hit and loads nothing."""
    return not any(n > 0 for n in kv_log(log_text)["injected_tokens"])


def transfer_metrics(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """The connector's counters from a ``/metrics`` scrape (``metrics.scrape``), flat so that ``metrics_delta``
    takes their difference: external cache queries and hits (tokens), and prompt tokens by source."""
    totals = metric_totals(samples)
    out = {k: totals.get(k, 0.0) for k in (EXTERNAL_QUERIES, EXTERNAL_HITS)}
    for name, labels, value in samples:
        if name == BY_SOURCE and "source" in labels:
            out[key] = out.get(key := f"prompt_tokens_{labels['source']}_total", 0.0) + value
    return out


# ---------------------------------------------------------------------------------------- ITL under a burst


def salted(prompt: Sequence[int], k: int) -> list[int]:
    """``prompt`` with its first token replaced by one of its own per ``k``: no cache, local or on disk, holds it."""
    return [1000 + k, *list(prompt)[1:]]


def burst_while_streaming(base_url: str, stream_prompts: Sequence[Sequence[int]], stream_tokens: int,
                          long_prompts: Sequence[Sequence[int]], long_tokens: int = 1, long_after: int = 4,
                          timeout_s: float = 300.0) -> dict[str, Any]:
    """Streams decoding ``stream_tokens`` each; after the first stream's ``long_after``-th chunk the long prompts
    arrive at once. Every stream's chunk stamps, and when the burst was sent and its last first token came."""
    if not 0 < long_after < stream_tokens:
        raise ValueError(f"long_after={long_after}: between 1 and stream_tokens - 1, the burst comes while still decoding")
    url = base_url.rstrip("/") + client.ENDPOINTS["completions"]

    async def go() -> dict[str, Any]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            model = await client.discover_model(session, base_url)

            def body(ids: Sequence[int], n: int) -> dict[str, Any]:
                return client.payload("completions", list(ids), model, n, ignore_eos=True, return_token_ids=True)

            streams, longs, sent = await client.burst_while_streaming(
                session, url, [body(p, stream_tokens) for p in stream_prompts], [body(p, long_tokens) for p in long_prompts],
                chat=False, after=long_after, timeout_s=timeout_s)
        firsts = [o.chunk_s[0] for o in longs if o.chunk_s]
        return {"stamps": [s.chunk_s for s in streams], "answers": [s.token_ids for s in streams],
                "burst_sent_s": sent, "burst_done_s": max(firsts) if len(firsts) == len(longs) else None,
                "errors": [o.error for o in [*streams, *longs] if o.error]}

    return loadgen.run_sync(go)


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

