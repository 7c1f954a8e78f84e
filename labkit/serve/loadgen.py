"""Load generation against any OpenAI-compatible server (labkit's, or ``vllm serve``), two ways.

``run`` / ``run_async``: an async streaming client with vLLM's benchmark semantics (``vllm bench serve``):
requests arrive at ``request_rate`` per second with gamma-distributed gaps (``burstiness`` 1 = Poisson,
below 1 burstier, ``inf`` rate = all at once), at most ``max_concurrency`` in flight. Each response is
streamed, so TTFT and the gaps between chunks (ITL) are measured on arrival, not derived. The summary
gives TTFT, TPOT = (E2E − TTFT)/(n_out − 1), ITL and E2E percentiles, requests/s, output tokens/s,
goodput (requests/s meeting every stated SLO) and failures.

``run_locust``: Locust, headless in a child process, with ``labkit/serve/locustfile.py`` (non-streaming
requests; Locust times the whole response). Its CSV statistics are parsed into a dict.

Command line (works unchanged against ``vllm serve``):
    python -m labkit loadgen --base-url http://127.0.0.1:8000 --num-prompts 64 --max-concurrency 8
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.results import jsonable
from ..core.timing import P99_MIN_SAMPLES, clock, latency_summary
from ..model.prompts import load_prompts

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
LOCUSTFILE = Path(__file__).with_name("locustfile.py")


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

    @property
    def tpot_s(self) -> float | None:
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class SLO:
    """Service-level objective for goodput: a request is good when it meets every limit given (seconds)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"SLO {name}={value!r}: must be a positive number of seconds (or None)")

    def met(self, out: RequestOutput) -> bool:
        if not out.success:
            return False
        tpot = out.tpot_s if out.tpot_s is not None else 0.0
        return ((self.ttft_s is None or out.ttft_s <= self.ttft_s) and (self.tpot_s is None or tpot <= self.tpot_s)
                and (self.e2e_s is None or out.e2e_s <= self.e2e_s))

    @classmethod
    def parse(cls, items: Sequence[str]) -> "SLO":
        """vLLM's ``--goodput ttft:500 tpot:50 e2el:2000`` (milliseconds)."""
        names = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s", "e2e": "e2e_s"}
        values: dict[str, float] = {}
        for item in items:
            key, _, ms = item.partition(":")
            if key not in names or not ms:
                raise ValueError(f"goodput item {item!r}: write NAME:MILLISECONDS with NAME in {sorted(names)}")
            try:
                values[names[key]] = float(ms) / 1e3
            except ValueError:
                raise ValueError(f"goodput item {item!r}: {ms!r} is not a number of milliseconds") from None
        return cls(**values)


@dataclass
class BenchmarkResult:
    """Raw per-request outputs plus the settings; every figure in ``summary()`` is derived from them."""

    outputs: list[RequestOutput]
    duration_s: float
    settings: dict[str, Any] = field(default_factory=dict)
    slo: SLO | None = None

    @property
    def completed(self) -> int:
        return sum(o.success for o in self.outputs)

    @property
    def failed(self) -> int:
        return len(self.outputs) - self.completed

    def summary(self) -> dict[str, Any]:
        """vLLM's figures, in seconds. p99 is None below ``timing.P99_MIN_SAMPLES`` values (the lab's one rule:
        fewer cannot say anything about a 1 % tail); p90 is there for small runs."""
        ok = [o for o in self.outputs if o.success]
        out_tokens = sum(o.output_tokens for o in ok)
        d = self.duration_s
        s: dict[str, Any] = {**self.settings, "requests": len(self.outputs), "completed": len(ok),
                             "failed": self.failed, "duration_s": d,
                             "request_throughput": len(ok) / d if d > 0 else None,
                             "output_tokens": out_tokens,
                             "output_tokens_per_s": out_tokens / d if d > 0 else None}
        s.update(latency_summary("ttft", [o.ttft_s for o in ok]))
        s.update(latency_summary("tpot", [o.tpot_s for o in ok if o.tpot_s is not None]))
        s.update(latency_summary("itl", [x for o in ok for x in o.itl_s]))
        s.update(latency_summary("e2e", [o.e2e_s for o in ok]))
        if self.slo is not None:
            good = sum(self.slo.met(o) for o in self.outputs)
            s.update(slo={k: v for k, v in asdict(self.slo).items() if v is not None}, good_requests=good,
                     goodput=good / d if d > 0 else None)
        errors: dict[str, int] = {}
        for o in self.outputs:
            if not o.success:
                key = f"{o.status or 'no response'}: {o.error[:80]}"
                errors[key] = errors.get(key, 0) + 1
        s["errors"] = errors
        return s

    def frame(self):
        """One row per request (pandas)."""
        import pandas as pd

        return pd.DataFrame([{**asdict(o), "tpot_s": o.tpot_s, "itl_s": None, "chunk_s": None} for o in self.outputs])


Prompt = str | Sequence[int]  # text, or token ids (already chat-formatted: sent as they are)


def _payload(endpoint: str, prompt: Prompt, model: str | None, max_tokens: int, ignore_eos: bool,
             return_token_ids: bool = False) -> dict[str, Any]:
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
                    else:
                        out.itl_s.append(stamp - last)
                    last = stamp
                    chunks += 1
                    out.chunk_s.append(stamp - t0)
                    parts.append(text or "")
                    out.token_ids.extend(int(t) for t in choice.get("token_ids") or ())
                    if on_chunk is not None:
                        on_chunk(chunks)
                if msg.get("usage"):
                    out.output_tokens = int(msg["usage"].get("completion_tokens") or 0)
        out.e2e_s = last - start
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


async def long_prompt_while_streaming(session: Any, url: str, stream_payloads: Sequence[dict[str, Any]],
                                      long_payload: dict[str, Any], *, chat: bool, long_after: int,
                                      timeout_s: float) -> tuple[list[RequestOutput], RequestOutput]:
    """The experiment of chunked prefill, for any server: the streams start together; once the first has
    received ``long_after`` chunks (or ended early) the long prompt is sent. (streams, long), every chunk stamped
    from one clock (``chunk_s``, ``start_s``)."""
    t0, seen = clock(), asyncio.Event()

    def first(n: int) -> None:
        if n >= long_after:
            seen.set()

    async def stream(i: int, payload: dict[str, Any]) -> RequestOutput:
        try:
            return await send_request(session, url, payload, chat, t0, on_chunk=first if i == 0 else None)
        finally:
            if i == 0:
                seen.set()  # a stream that ended early must not leave the long prompt waiting

    streams = [asyncio.create_task(stream(i, p)) for i, p in enumerate(stream_payloads)]
    await asyncio.wait_for(seen.wait(), timeout=timeout_s)  # the streams are decoding: now the long prompt comes
    long = await send_request(session, url, long_payload, chat, t0)
    return list(await asyncio.gather(*streams)), long


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


def _check(num_requests: int, request_rate: float, burstiness: float, max_concurrency: int | None,
           max_tokens: int | Sequence[int], endpoint: str) -> None:
    limits = list(max_tokens) if isinstance(max_tokens, (list, tuple)) else [max_tokens]
    if not limits:
        raise ValueError("max_tokens=[]: give one positive integer, or a list of them (one per request, cycled)")
    for name, value in [("num_requests", num_requests)] + [("max_tokens", m) for m in limits]:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    if max_concurrency is not None and (isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int)
                                        or max_concurrency <= 0):
        raise ValueError(f"max_concurrency={max_concurrency!r}: a positive integer, or None for no limit")
    if not request_rate > 0:
        raise ValueError(f"request_rate={request_rate!r}: requests per second > 0, or float('inf') for all at once")
    if not burstiness > 0:
        raise ValueError(f"burstiness={burstiness!r}: must be > 0 (1 = Poisson, < 1 burstier, > 1 steadier)")
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint={endpoint!r}: choose one of {sorted(ENDPOINTS)}")


def arrival_gaps(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds to wait after each request before the next: gamma(shape=burstiness, mean=1/rate), as vLLM."""
    if math.isinf(request_rate):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (request_rate * burstiness)
    return [rng.gammavariate(burstiness, theta) for _ in range(n)]


async def run_async(base_url: str, prompts: Sequence[Prompt] | None = None, *, num_requests: int = 32,
                    request_rate: float = math.inf, burstiness: float = 1.0, max_concurrency: int | None = None,
                    max_tokens: int | Sequence[int] = 32, endpoint: str = "completions", model: str | None = None,
                    ignore_eos: bool = True, slo: SLO | None = None, seed: int = 0, timeout_s: float = 600.0,
                    warmup: int = 1, progress: Callable[[int, int], None] | None = None,
                    return_token_ids: bool = False, read_timeout_s: float | None = None,
                    on_start: Callable[[], Any] | None = None) -> BenchmarkResult:
    """Send ``num_requests`` streaming requests and measure them (see the module docstring).

    ``prompts`` and ``max_tokens`` (an int, or a list) are taken round-robin, request ``i`` getting entry
    ``i`` modulo their length: a mixed workload is two lists. A prompt is text, or token ids (the completions
    endpoint only): ids already chat-formatted reach the model exactly as an offline engine is fed them.

    ``timeout_s`` bounds each request; ``read_timeout_s`` the wait for its next bytes, so a server that stops
    answering mid-stream fails its requests then. A server that dies closes its connections: its requests fail at
    once. Either way every request comes back, answered or counted failed with its error.

    ``on_start`` is called once the ``warmup`` requests are answered, just before the first measured one: read a
    server's counters there (``metrics.snapshot``) and again after, and their difference leaves the warm-up out."""
    import aiohttp

    _check(num_requests, request_rate, burstiness, max_concurrency, max_tokens, endpoint)
    if prompts is None:
        prompts = load_prompts("prompts")
    if not prompts:
        raise ValueError("no prompts: pass at least one string (or one list of token ids)")
    limits = list(max_tokens) if isinstance(max_tokens, (list, tuple)) else [max_tokens]
    url = base_url.rstrip("/") + ENDPOINTS[endpoint]
    chat = endpoint == "chat"
    connector = aiohttp.TCPConnector(limit=max_concurrency or 0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s, sock_read=read_timeout_s)) as session:
        model = model or await discover_model(session, base_url)
        for _ in range(warmup):  # one untimed request: fails fast when the server is not there
            test = await send_request(session, url, _payload(endpoint, prompts[0], model, min(limits[0], 4),
                                                             ignore_eos), chat, clock())
            if not test.success:
                raise RuntimeError(f"{url} did not answer the test request (HTTP {test.status}): {test.error}")
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        done = 0

        async def one(i: int, t0: float) -> RequestOutput:
            nonlocal done
            payload = _payload(endpoint, prompts[i % len(prompts)], model, limits[i % len(limits)], ignore_eos,
                               return_token_ids)
            if gate is None:
                out = await send_request(session, url, payload, chat, t0)
            else:
                async with gate:
                    out = await send_request(session, url, payload, chat, t0)
            done += 1
            if progress is not None:
                progress(done, num_requests)
            return out

        gaps = arrival_gaps(num_requests, request_rate, burstiness, seed)
        if on_start is not None:
            on_start()  # after the warm-up: what it ran stays out of a before/after difference
        t0 = clock()
        tasks = []
        for i in range(num_requests):
            tasks.append(asyncio.create_task(one(i, t0)))
            if gaps[i] > 0:
                await asyncio.sleep(gaps[i])
        outputs = await asyncio.gather(*tasks)
        duration = clock() - t0
    settings = {"endpoint": endpoint, "model": model, "request_rate": request_rate, "burstiness": burstiness,
                "concurrency": max_concurrency, "max_tokens": limits[0] if len(limits) == 1 else f"{min(limits)}-{max(limits)}",
                "ignore_eos": ignore_eos}
    return BenchmarkResult(outputs=list(outputs), duration_s=duration, settings=settings, slo=slo)


def run_sync(coro_fn: Callable[[], Any]) -> Any:
    """``coro_fn()``'s coroutine run to its end from synchronous code, also inside Jupyter (whose event loop is
    already running: then on a fresh loop in a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(coro_fn())).result()


def run(base_url: str, prompts: Sequence[Prompt] | None = None, **kwargs: Any) -> BenchmarkResult:
    """``run_async`` from synchronous code, also inside Jupyter (whose event loop is already running)."""
    return run_sync(lambda: run_async(base_url, prompts, **kwargs))


# --------------------------------------------------------------------------------------------- Locust


def read_locust_csv(path: str | Path) -> dict[str, Any]:
    """Locust's ``<prefix>_stats.csv``: the aggregated row and each endpoint's, times in seconds."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: Locust wrote no statistics (did it start? see its output)")

    def num(value: str) -> float | None:
        try:
            return float(value)
        except ValueError:
            return None

    rows = {}
    with path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            ms = {q: num(row.get(q, "N/A")) for q in ("50%", "90%", "95%", "99%")}
            if int(row["Request Count"]) < P99_MIN_SAMPLES:
                ms["99%"] = None  # the lab's one rule: no 1 % tail from fewer than P99_MIN_SAMPLES requests
            rows[row["Name"]] = {
                "requests": int(row["Request Count"]), "failures": int(row["Failure Count"]),
                "requests_per_s": num(row["Requests/s"]),
                "response_mean_s": (num(row["Average Response Time"]) or 0) / 1e3,
                "response_p50_s": ms["50%"] / 1e3 if ms["50%"] is not None else None,
                "response_p90_s": ms["90%"] / 1e3 if ms["90%"] is not None else None,
                "response_p95_s": ms["95%"] / 1e3 if ms["95%"] is not None else None,
                "response_p99_s": ms["99%"] / 1e3 if ms["99%"] is not None else None,
                "response_max_s": (num(row["Max Response Time"]) or 0) / 1e3,
            }
    if "Aggregated" not in rows:
        raise ValueError(f"{path}: no 'Aggregated' row; is this a Locust stats CSV?")
    return {"aggregated": rows.pop("Aggregated"), "endpoints": rows}


def run_locust(base_url: str, users: int = 8, spawn_rate: float | None = None, run_time_s: int = 10,
               max_tokens: int = 16, endpoint: str = "completions", stop_timeout_s: int = 60,
               locustfile: str | Path = LOCUSTFILE) -> dict[str, Any]:
    """Run Locust headless against ``base_url`` for ``run_time_s`` seconds; return its parsed statistics.

    Each simulated user sends non-streaming requests back to back (``ignore_eos``: exactly ``max_tokens``
    tokens each), so output tokens/s = requests/s × max_tokens. Users still waiting when the time is up
    finish their request (``--stop-timeout``) rather than being cut off.
    """
    _check(1, math.inf, 1.0, users, max_tokens, endpoint)
    if isinstance(run_time_s, bool) or not isinstance(run_time_s, int) or run_time_s <= 0:
        raise ValueError(f"run_time_s={run_time_s!r}: must be a positive whole number of seconds")
    local = "127.0.0.1,localhost,::1"
    env = {**os.environ, "LABKIT_LOCUST_MAX_TOKENS": str(max_tokens), "LABKIT_LOCUST_ENDPOINT": endpoint,
           "NO_PROXY": local, "no_proxy": local}
    with tempfile.TemporaryDirectory(prefix="labkit-locust-") as tmp:
        prefix = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", str(users),
               "-r", str(spawn_rate or users), "--run-time", f"{run_time_s}s", "--host", base_url.rstrip("/"),
               "--csv", str(prefix), "--only-summary", "--stop-timeout", str(stop_timeout_s), "--loglevel", "WARNING"]
        t0 = clock()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=run_time_s + stop_timeout_s + 120)
        wall = clock() - t0
        try:
            stats = read_locust_csv(f"{prefix}_stats.csv")
        except FileNotFoundError as exc:
            raise RuntimeError(f"{exc}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}") from None
    agg = stats["aggregated"]
    agg["output_tokens_per_s"] = agg["requests_per_s"] * max_tokens if agg["requests_per_s"] else None
    return {**stats, "users": users, "run_time_s": run_time_s, "max_tokens": max_tokens, "wall_s": wall,
            "exit_code": proc.returncode, "command": " ".join(cmd[1:])}


# ----------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit loadgen", description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default %(default)s)")
    ap.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="completions")
    ap.add_argument("--model", default=None, help="model name to send (default: the first at /v1/models)")
    ap.add_argument("--num-prompts", type=int, default=64, help="requests to send")
    ap.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (default inf: all at once)")
    ap.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 Poisson, <1 burstier")
    ap.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="let answers stop early")
    ap.add_argument("--goodput", nargs="*", default=[], help="SLOs in ms, e.g. ttft:500 tpot:50 e2el:2000")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        slo = SLO.parse(args.goodput) if args.goodput else None
        res = run(args.base_url, num_requests=args.num_prompts, request_rate=args.request_rate,
                  burstiness=args.burstiness, max_concurrency=args.max_concurrency, max_tokens=args.max_tokens,
                  endpoint=args.endpoint, model=args.model, ignore_eos=args.ignore_eos, slo=slo, seed=args.seed)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(jsonable(res.summary()), allow_nan=False))
    return 0

