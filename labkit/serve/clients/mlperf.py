"""MLPerf Inference's LoadGen (``mlcommons-loadgen``) driving an OpenAI-compatible server through a small SUT adapter.

LoadGen decides when each query is issued (Server: Poisson arrivals at ``server_target_qps``; Offline: all at once)
and judges the run; the system under test (SUT) only has to send each query and say when its first token and its
last arrived. ``SUT`` streams each issued query's prompt to the server from an event loop of its own and calls
``report(lg, query_id, event, tokens)`` on the first token ("first") and at the end ("done", with the server's count
of output tokens): those two calls are LoadGen's ``FirstTokenComplete`` and ``QuerySamplesComplete`` (``report``, the
reference of the learner's exercise). ``run`` sets LoadGen up, runs one test and reads ``mlperf_log_summary.txt``:
"Result is : VALID" or "INVALID", and the constraint lines that say why.

The latency limits come from the ``mlperf.conf`` inside LoadGen (``official_limits``: llama3.1-8b's Server TTFT and
TPOT); ``limits`` rescales them to this machine (``TPOT_HEADROOM`` × a TPOT measured here, the official TTFT : TPOT
ratio kept). Durations and query counts are shortened for a laptop and the latency percentile lowered (``PERCENTILE``:
early stopping at MLPerf's p99 needs about 460 queries): such a run is never compliant, and ``run`` says so.
"""
from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.checks import positive
from ...core.timing import clock
from ..client import payload, send_request

MODEL = "llama3_1-8b"  # the MLPerf benchmark whose Server limits are rescaled
TPOT_HEADROOM = 3.0  # the TPOT limit: this many times a TPOT measured on the machine
PERCENTILE = 0.9  # the latency percentile judged here (MLPerf: 0.99, which needs ~460 queries to stop early)
NOT_COMPLIANT = ("not an MLPerf result: durations, query counts and the latency percentile are shortened for a laptop, "
                 "and the limits rescaled to it")
Report = Callable[[Any, int, str, int], None]


def report(lg: Any, query_id: int, event: str, tokens: int) -> None:
    """Tell LoadGen what happened to query ``query_id``: its first token arrived ("first"), or its answer is complete
    ("done") with ``tokens`` output tokens (LoadGen divides the time after the first token by them: TPOT)."""
    if event == "first":
        lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, 0, 0)])
    elif event == "done":
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, 0, 0, tokens)])
    else:
        raise ValueError(f"event={event!r}: 'first' or 'done'")


def loadgen() -> Any:
    """The ``mlperf_loadgen`` module, or ImportError naming the install."""
    try:
        import mlperf_loadgen
    except ImportError as exc:
        raise ImportError("mlcommons-loadgen is not installed here: `make setup` installs it with the lab's extras "
                          "(pip install 'mlcommons-loadgen==6.0.17')") from exc
    return mlperf_loadgen


def official_limits(model: str = MODEL) -> dict[str, float]:
    """``model``'s Server TTFT and TPOT limits (seconds), read from the ``mlperf.conf`` built into LoadGen."""
    lib = Path(loadgen().__file__).read_bytes()
    found = {}
    for key in ("ttft_latency", "tpot_latency"):
        m = re.search(rb"\n" + re.escape(model.encode()) + rb"\.Server\." + key.encode() + rb" = (\d+)", lib)
        if m is None:
            raise LookupError(f"{model}.Server.{key} is not in this LoadGen's mlperf.conf")
        found[key.split("_")[0] + "_s"] = int(m.group(1)) / 1e3
    return found


def limits(single_tpot_s: float, official: dict[str, float] | None = None) -> dict[str, float]:
    """This machine's limits: TPOT ``TPOT_HEADROOM`` × a TPOT measured here, TTFT at the official TTFT : TPOT ratio."""
    if not single_tpot_s > 0:
        raise ValueError(f"single_tpot_s={single_tpot_s!r}: a TPOT measured on this machine, seconds > 0")
    official = official or official_limits()
    tpot = TPOT_HEADROOM * single_tpot_s
    return {"ttft_s": tpot * official["ttft_s"] / official["tpot_s"], "tpot_s": tpot,
            "official_ttft_s": official["ttft_s"], "official_tpot_s": official["tpot_s"]}


@dataclass
class LoadGenResult:
    scenario: str
    qps: float
    valid: bool | None
    lines: dict[str, str] = field(default_factory=dict)  # the summary's "key : value" lines
    summary: str = ""
    outdir: str = ""
    sent: int = 0
    failed: int = 0
    note: str = NOT_COMPLIANT

    def row(self) -> dict[str, Any]:
        keep = ("Result is", "Samples per second", "Early stopping satisfied", "Min duration satisfied",
                "Min queries satisfied",
                "Performance constraints satisfied", "Completed samples per second", "Scheduled samples per second",
                "TTFT Early Stopping Result", "TPOT Early Stopping Result")
        return {"scenario": self.scenario, "target_qps": self.qps,
                **{k: v for k, v in self.lines.items() if k in keep}, "queries": self.sent, "failed": self.failed}


def read_summary(text: str) -> dict[str, str]:
    """``mlperf_log_summary.txt``'s ``key : value`` lines (the first of each key)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and value.strip() and key.strip() not in out:
            out[key.strip()] = value.strip()
    return out


class SUT:
    """Each issued query's prompt streamed to ``url`` (``model``, greedy, exactly ``max_tokens`` tokens), ``report``
    called from the SUT's own event loop thread on the first token and at the end. ``errors``: failed requests (each
    still completed to LoadGen, with 0 tokens, so the test ends)."""

    def __init__(self, url: str, model: str, prompts: Sequence[str], max_tokens: int, report: Report = report) -> None:
        positive("max_tokens", max_tokens)
        if not prompts:
            raise ValueError("no prompts: the query sample library needs at least one")
        self.url, self.model, self.prompts, self.max_tokens, self.report = url.rstrip("/"), model, list(prompts), \
            max_tokens, report
        self.errors: list[str] = []
        self.sent = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="labkit-mlperf-sut", daemon=True)
        self._thread.start()
        self._session: Any = None

    async def _one(self, lg: Any, query_id: int, index: int) -> None:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        body = payload("completions", self.prompts[index % len(self.prompts)], self.model, self.max_tokens, True)
        first = False

        def on_chunk(n: int) -> None:
            nonlocal first
            if n == 1:
                first = True
                self.report(lg, query_id, "first", 0)

        out = await send_request(self._session, self.url + "/v1/completions", body, False, clock(), on_chunk=on_chunk)
        if not out.success:
            self.errors.append(out.error or f"HTTP {out.status}")
        if not first:  # a failed query is still completed to LoadGen (0 tokens), so that the test ends
            self.report(lg, query_id, "first", 0)
        self.report(lg, query_id, "done", out.output_tokens if out.success else 0)

    def issue(self, lg: Any, samples: Sequence[Any]) -> None:
        for s in samples:
            self.sent += 1
            asyncio.run_coroutine_threadsafe(self._one(lg, s.id, s.index), self.loop)

    def close(self) -> None:
        async def shut() -> None:
            if self._session is not None:
                await self._session.close()
        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def run(url: str, model: str, prompts: Sequence[str], outdir: str | Path, *, scenario: str, qps: float,
        max_tokens: int, ttft_s: float, tpot_s: float, min_duration_s: float, min_queries: int,
        report: Report = report, percentile: float = PERCENTILE) -> LoadGenResult:
    """One LoadGen performance test (``scenario`` "Server" at ``qps`` queries/s, or "Offline" expecting ``qps``) over
    ``url`` through ``SUT``; the summary's verdict and lines. ``ttft_s``/``tpot_s`` are the Server's limits."""
    lg = loadgen()
    if scenario not in ("Server", "Offline"):
        raise ValueError(f"scenario={scenario!r}: 'Server' or 'Offline'")
    for name, value in (("qps", qps), ("ttft_s", ttft_s), ("tpot_s", tpot_s), ("min_duration_s", min_duration_s)):
        if not value > 0:
            raise ValueError(f"{name}={value!r}: a positive number")
    positive("min_queries", min_queries)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, scenario)
    settings.mode = lg.TestMode.PerformanceOnly
    settings.use_token_latencies = True
    settings.min_duration_ms = int(min_duration_s * 1e3)
    settings.min_query_count = int(min_queries)
    if scenario == "Server":
        settings.server_target_qps = float(qps)
        settings.ttft_latency = int(ttft_s * 1e9)
        settings.tpot_latency = int(tpot_s * 1e9)
        settings.server_target_latency_percentile = float(percentile)
    else:
        settings.offline_expected_qps = float(qps)
    log = lg.LogSettings()
    log.log_output = lg.LogOutputSettings()
    log.log_output.outdir = str(outdir)
    log.log_output.copy_summary_to_stdout = False
    log.enable_trace = False
    sut_ = SUT(url, model, prompts, max_tokens, report)
    sut = lg.ConstructSUT(lambda samples: sut_.issue(lg, samples), lambda: None)
    qsl = lg.ConstructQSL(len(prompts), len(prompts), lambda _s: None, lambda _s: None)
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        sut_.close()
    path = outdir / "mlperf_log_summary.txt"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    lines = read_summary(text)
    verdict = lines.get("Result is")
    return LoadGenResult(scenario=scenario, qps=qps, valid=None if verdict is None else verdict == "VALID",
                         lines=lines, summary=text, outdir=str(outdir), sent=sut_.sent, failed=len(sut_.errors))
