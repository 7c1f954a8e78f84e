"""Load generation against any OpenAI-compatible server (labkit's, or ``vllm serve``), two ways.

``run`` / ``run_async``: an async streaming client with vLLM's benchmark semantics (``vllm bench serve``), sending a
``Workload`` (one record of what is sent, as vLLM's ``RequestFuncInput`` and nano-vllm's ``SamplingParams``):
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..core.checks import positive
from ..core.results import jsonable
from ..core.timing import P99_MIN_SAMPLES, clock, latency_summary
from ..model.prompts import load_prompts
from . import client
from .client import ENDPOINTS, Prompt, RequestOutput, discover_model, run_sync, send_request

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


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
    origin_s: float | None = None  # the clock() (time.perf_counter) reading each output's start_s counts from

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


@dataclass(frozen=True)
class Workload:
    """What a load run sends: ``num_requests`` requests to ``endpoint``, ``prompts`` (text, or token ids for the
    completions endpoint; None: the lab's prompts) and ``max_tokens`` (one limit, or one per request) taken
    round-robin, request ``i`` getting entry ``i`` modulo their length (a mixed workload is two lists); arrivals at
    ``request_rate`` per second with gamma gaps of shape ``burstiness`` (drawn from ``seed``), at most
    ``max_concurrency`` in flight (None: no limit). Greedy; ``ignore_eos``: exactly ``max_tokens`` tokens each;
    ``return_token_ids``: each chunk carries its token ids (vLLM). ``model``: the name sent (None: the server's
    first); ``tokenizer``: a local directory, for the outside clients that count tokens themselves."""

    prompts: Sequence[Prompt] | None = None  # kept as a tuple
    num_requests: int = 32
    max_tokens: int | Sequence[int] = 32  # a sequence kept as a tuple
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    endpoint: str = "completions"
    model: str | None = None
    tokenizer: str | None = None
    ignore_eos: bool = True
    return_token_ids: bool = False

    def __post_init__(self) -> None:
        if self.prompts is not None:
            object.__setattr__(self, "prompts", tuple(self.prompts))
            if not self.prompts:
                raise ValueError("no prompts: pass at least one string (or one list of token ids)")
        if isinstance(self.max_tokens, (list, tuple)):
            object.__setattr__(self, "max_tokens", tuple(self.max_tokens))
            if not self.max_tokens:
                raise ValueError("max_tokens=[]: give one positive integer, or a list of them (one per request, "
                                 "cycled)")
        positive("num_requests", self.num_requests)
        for limit in self.limits:
            positive("max_tokens", limit)
        if self.max_concurrency is not None and (isinstance(self.max_concurrency, bool) or not isinstance(
                self.max_concurrency, int) or self.max_concurrency <= 0):
            raise ValueError(f"max_concurrency={self.max_concurrency!r}: a positive integer, or None for no limit")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate={self.request_rate!r}: requests per second > 0, or float('inf') for all "
                             "at once")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness={self.burstiness!r}: must be > 0 (1 = Poisson, < 1 burstier, > 1 steadier)")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint={self.endpoint!r}: choose one of {sorted(ENDPOINTS)}")

    @property
    def limits(self) -> tuple[int, ...]:
        """``max_tokens`` as a tuple: one entry per request, cycled."""
        return self.max_tokens if isinstance(self.max_tokens, tuple) else (self.max_tokens,)

    def settings(self, model: str | None) -> dict[str, Any]:
        """What a result records of its workload (``model``: the name the server answered to)."""
        limits = self.limits
        return {"endpoint": self.endpoint, "model": model, "request_rate": self.request_rate,
                "burstiness": self.burstiness, "concurrency": self.max_concurrency,
                "max_tokens": limits[0] if len(limits) == 1 else f"{min(limits)}-{max(limits)}",
                "ignore_eos": self.ignore_eos}


WORKLOAD_FIELDS = tuple(f.name for f in fields(Workload))


def slo_from_baseline(target: Any, baseline: dict[str, Any], factor: float = 3.0) -> tuple[Any, str]:
    """The SLO a load test on this machine can use, from one request measured alone (``baseline``: a
    load test's summary at concurrency 1): ``target`` when one request alone meets it, else ``factor`` × the
    baseline's median TTFT and TPOT, with a sentence saying which and why."""
    ttft, tpot = baseline.get("ttft_p50_s"), baseline.get("tpot_p50_s")
    if not ttft or not tpot:
        raise ValueError("the baseline has no TTFT/TPOT medians: did its requests complete? (see its 'errors')")
    alone = f"one request alone: TTFT {ttft:.2f} s, TPOT {tpot:.3f} s (median of {baseline.get('completed')})"
    if (target.ttft_s is None or ttft <= target.ttft_s) and (target.tpot_s is None or tpot <= target.tpot_s):
        return target, f"SLO TTFT ≤ {target.ttft_s} s, TPOT ≤ {target.tpot_s} s: reachable here ({alone})"
    slo = SLO(ttft_s=factor * ttft, tpot_s=factor * tpot)
    return slo, (f"The target SLO (TTFT ≤ {target.ttft_s} s, TPOT ≤ {target.tpot_s} s) is unreachable here: {alone}. "
                 f"This run's SLO is {factor:g}× that: TTFT ≤ {slo.ttft_s:.2f} s, TPOT ≤ {slo.tpot_s:.3f} s")


def arrival_gaps(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds to wait after each request before the next: gamma(shape=burstiness, mean=1/rate), as vLLM."""
    if math.isinf(request_rate):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (request_rate * burstiness)
    return [rng.gammavariate(burstiness, theta) for _ in range(n)]


async def run_async(base_url: str, workload: Workload, *, slo: SLO | None = None, warmup: int = 1,
                    timeout_s: float = 600.0, read_timeout_s: float | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    on_start: Callable[[], Any] | None = None) -> BenchmarkResult:
    """Send ``workload`` to the server at ``base_url`` and measure every request (see the module docstring); judge
    them against ``slo`` when given.

    ``warmup`` untimed requests go first (the first one fails fast when the server is not there). ``timeout_s``
    bounds each request; ``read_timeout_s`` the wait for its next bytes, so a server that stops answering
    mid-stream fails its requests then. A server that dies closes its connections: its requests fail at once.
    Either way every request comes back, answered or counted failed with its error. ``progress(done, total)`` is
    called as each one ends.

    ``on_start`` is called once the ``warmup`` requests are answered, just before the first measured one: read a
    server's counters there (``metrics.snapshot``) and again after, and their difference leaves the warm-up out."""
    import aiohttp

    w = workload
    prompts = w.prompts if w.prompts is not None else tuple(load_prompts("prompts"))
    limits, n = w.limits, w.num_requests
    url = base_url.rstrip("/") + ENDPOINTS[w.endpoint]
    chat = w.endpoint == "chat"
    connector = aiohttp.TCPConnector(limit=w.max_concurrency or 0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_read=read_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model = w.model or await discover_model(session, base_url)
        for _ in range(warmup):  # one untimed request: fails fast when the server is not there
            test = await send_request(session, url, client.payload(w.endpoint, prompts[0], model, min(limits[0], 4),
                                                                   w.ignore_eos), chat, clock())
            if not test.success:
                raise RuntimeError(f"{url} did not answer the test request (HTTP {test.status}): {test.error}")
        gate = asyncio.Semaphore(w.max_concurrency) if w.max_concurrency else None
        done = 0

        async def one(i: int, t0: float) -> RequestOutput:
            nonlocal done
            payload = client.payload(w.endpoint, prompts[i % len(prompts)], model, limits[i % len(limits)],
                                     w.ignore_eos, w.return_token_ids)
            if gate is None:
                out = await send_request(session, url, payload, chat, t0)
            else:
                async with gate:
                    out = await send_request(session, url, payload, chat, t0)
            done += 1
            if progress is not None:
                progress(done, n)
            return out

        gaps = arrival_gaps(n, w.request_rate, w.burstiness, w.seed)
        if on_start is not None:
            on_start()  # after the warm-up: what it ran stays out of a before/after difference
        t0 = clock()
        tasks = []
        for i in range(n):
            tasks.append(asyncio.create_task(one(i, t0)))
            if gaps[i] > 0:
                await asyncio.sleep(gaps[i])
        outputs = await asyncio.gather(*tasks)
        duration = clock() - t0
    return BenchmarkResult(outputs=list(outputs), duration_s=duration, settings=w.settings(model), slo=slo,
                           origin_s=t0)


def run(base_url: str, work: Workload | Sequence[Prompt] | None = None, **kwargs: Any) -> BenchmarkResult:
    """``run_async`` from synchronous code, also inside Jupyter (whose event loop is already running). ``work`` is a
    ``Workload``, or its prompts with its other fields among the keywords (``run(url, num_requests=8, max_tokens=16,
    warmup=0)``); the remaining keywords are ``run_async``'s."""
    if not isinstance(work, Workload):
        work = Workload(work, **{k: kwargs.pop(k) for k in WORKLOAD_FIELDS if k in kwargs})
    return run_sync(lambda: run_async(base_url, work, **kwargs))


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
    Workload(max_concurrency=users, max_tokens=max_tokens, endpoint=endpoint)  # checks the three
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
    ap.add_argument("--prompts-file", default=None, help="JSONL of {\"prompt\": ...} lines, sent as they are "
                    "(vllm bench serve's custom dataset); default: the lab's prompts")
    ap.add_argument("--records", default=None, help="write every request's record here (JSON), beside the summary")
    ap.add_argument("--warmup", type=int, default=1, help="untimed requests first (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        slo = SLO.parse(args.goodput) if args.goodput else None
        texts = read_prompts_file(args.prompts_file) if args.prompts_file else None
        work = Workload(texts, num_requests=args.num_prompts, max_tokens=args.max_tokens,
                        max_concurrency=args.max_concurrency, request_rate=args.request_rate,
                        burstiness=args.burstiness, seed=args.seed, endpoint=args.endpoint, model=args.model,
                        ignore_eos=args.ignore_eos)
        res = run(args.base_url, work, warmup=args.warmup, slo=slo)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.records:
        Path(args.records).write_text(json.dumps(jsonable({"duration_s": res.duration_s, "settings": res.settings,
                                                           "origin_s": res.origin_s,
                                                           "outputs": [asdict(o) for o in res.outputs]})),
                                      encoding="utf-8")
    print(json.dumps(jsonable(res.summary()), allow_nan=False))
    return 0


def read_prompts_file(path: str | Path) -> list[str]:
    """The prompts of a JSONL file of ``{"prompt": ...}`` lines (``vllm bench serve``'s custom dataset)."""
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        prompts = [json.loads(line)["prompt"] for line in lines]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: each line must be a JSON object with a \"prompt\" ({exc})") from None
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def read_records(path: str | Path) -> BenchmarkResult:
    """A run written by ``--records``, back as a ``BenchmarkResult``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return BenchmarkResult(outputs=[RequestOutput(**o) for o in data["outputs"]], duration_s=data["duration_s"],
                           settings=data.get("settings", {}), origin_s=data.get("origin_s"))

