"""What the first request pays, and the warmup a server runs before it takes traffic.

``cold_start`` spawns a fresh Python process (``python -m labkit cold-start``) that times each phase
of a cold start — interpreter start, imports, model load, then requests — and reports them as
JSON: nothing is cached in that process, so its first request is truly cold.

``warmup`` calls the model until the latency settles: the spread of the last ``window`` calls,
as ``labkit.core.timing.Measurement`` defines it ((p90 - p10) / median), falls under ``until_spread``.
It stops after ``max_calls`` whatever happens, and says whether it settled.
"""
from __future__ import annotations

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time
from collections.abc import Callable  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

from ..core import config, env, memory, timing, verdict
from ..core.checks import model_device
from ..core.timing import Measurement
from ..decoding import cache_variants, generation
from ..decoding.cache_variants import cache_variant_kwargs
from ..model import models

_SPAWNED_AT = time.time()  # wall clock, comparable across processes: read first, before heavy imports
SPAWN_ENV = "LABKIT_SPAWN_TIME"
DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."
PHASES = ("process_start_s", "import_s", "cuda_init_s", "load_s", "first_request_s", "second_request_s")


# ---------------------------------------------------------------- settling

def _check_settle_args(until_spread: float, window: int, max_calls: int | None = None) -> None:
    if not until_spread > 0:
        raise ValueError(f"until_spread={until_spread}: must be a positive fraction such as 0.10 (10 %)")
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window={window!r}: need a whole number of at least 2 calls to have a spread")
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < window):
        raise ValueError(f"max_calls={max_calls!r}: must be a whole number of at least window={window}")


def window_spread(latencies_s: list[float]) -> float:
    """Spread of a run of calls, with Measurement's definition."""
    return Measurement.from_values("window", latencies_s).spread


def window_spreads(latencies_s: list[float], window: int = 5) -> list[float | None]:
    """For each call, the spread of the ``window`` calls ending there (``None`` before a full window)."""
    _check_settle_args(1.0, window)
    return [window_spread(latencies_s[i + 1 - window:i + 1]) if i + 1 >= window else None
            for i in range(len(latencies_s))]


def settle_point(latencies_s: list[float], until_spread: float = 0.10, window: int = 5) -> int | None:
    """How many calls came before the first steady window (spread under ``until_spread``); None if none."""
    _check_settle_args(until_spread, window)
    for end, spread in enumerate(window_spreads(latencies_s, window), start=1):
        if spread is not None and spread < until_spread:
            return end - window
    return None


def one_time_share(latencies_s: list[float], window: int = 5) -> float:
    """The share of the first call that is one-time cost: (first - steady) / first, where steady is the median
    of the last ``window`` calls."""
    _check_settle_args(1.0, window)
    if len(latencies_s) < window + 1:
        raise ValueError(f"{len(latencies_s)} latencies: need the first call and a steady window of {window} after it")
    steady = Measurement.from_values("steady", latencies_s[-window:]).median
    return (latencies_s[0] - steady) / latencies_s[0]


def one_time_said(latencies_s: list[float], window: int, share: float) -> str:
    """The first call's one-time cost in words, chosen by ``verdict.against`` (the first call against the last
    ``window`` calls): a cost where it lies above their range, else what it was and that no cost shows."""
    first = latencies_s[0]
    steady = Measurement.from_values("steady", latencies_s[-window:]).median
    v = verdict.against(first, latencies_s[-window:], higher_is_better=False)
    extra_ms = (first - steady) * 1e3
    if v.kind == verdict.WORSE:
        return f"one-time cost: {share:.0%} of the first request ({extra_ms:.0f} ms of {first * 1e3:.0f} ms; {v.reason})"
    return (f"the first request was {extra_ms:+.0f} ms against the steady median ({share:.0%} of it), {v.label} "
            f"({v.reason}): no one-time cost shows above this run's noise")


@dataclass
class WarmupReport:
    """What a warmup did: every call's latency, and whether (and after how many calls) it settled."""

    latencies_s: list[float]
    until_spread: float
    window: int
    max_calls: int
    settled: bool
    warmup_calls: int | None  # calls before the first steady window; None when it never settled
    final_spread: float | None  # spread of the last window measured

    @property
    def calls(self) -> int:
        return len(self.latencies_s)

    @property
    def steady_s(self) -> float | None:
        """Median latency of the steady window (None when it never settled)."""
        if self.warmup_calls is None:
            return None
        return Measurement.from_values("steady", self.latencies_s[self.warmup_calls:self.warmup_calls + self.window]).median

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "calls": self.calls, "steady_s": self.steady_s}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WarmupReport":
        keys = ("latencies_s", "until_spread", "window", "max_calls", "settled", "warmup_calls", "final_spread")
        return cls(**{k: data[k] for k in keys})


def warmup_calls(fn: Callable[[], Any], *, until_spread: float = 0.10, max_calls: int = 30, window: int = 5,
                 clock: Callable[[], float] | None = None, device: Any = None) -> WarmupReport:
    """Call ``fn()`` until the last ``window`` latencies spread less than ``until_spread`` (or ``max_calls``).

    ``clock`` defaults to labkit's one timing primitive (``timing.now``, which synchronises a GPU);
    a test may pass a fake clock.
    """
    _check_settle_args(until_spread, window, max_calls)
    read = clock or (lambda: timing.now(device))
    latencies: list[float] = []
    spread: float | None = None
    while len(latencies) < max_calls:
        t0 = read()
        fn()
        latencies.append(read() - t0)
        if len(latencies) >= window:
            spread = window_spread(latencies[-window:])
            if spread < until_spread:
                return WarmupReport(latencies, until_spread, window, max_calls, True, len(latencies) - window, spread)
    return WarmupReport(latencies, until_spread, window, max_calls, False, None, spread)


def warmup(model: Any, tokenizer: Any, *, until_spread: float = 0.10, max_calls: int = 30, window: int = 5,
           prompt: str = DEFAULT_PROMPT, max_new_tokens: int = 8, **gen_kwargs: Any) -> WarmupReport:
    """The call a server makes at start: short greedy requests until latency settles."""
    device = next(model.parameters()).device

    def request() -> None:
        generation.generate(model, tokenizer, prompt, max_new_tokens=max_new_tokens, fixed_length=True, **gen_kwargs)

    return warmup_calls(request, until_spread=until_spread, max_calls=max_calls, window=window, device=device)


def compile_cost(module: Any, *example: Any, repeats: int = 8, fresh_cache: bool = True) -> dict[str, Any]:
    """First and steady call of ``module(*example)`` eager and under a fresh ``torch.compile``.

    The compiled module's first call traces and compiles (inductor generates and builds C++ or
    Triton code); later calls with the same shapes reuse it. ``fresh_cache`` hides inductor's
    on-disk cache so the first call pays the whole compilation, as on a new machine. Example
    tensors follow the module: they are moved to its device, and every call is timed there. The steady calls run
    in ``repeats`` rounds, each in a shuffled order (``timing.interleave``): round i of eager and round i of compiled
    form a pair (``samples``, round i at index i; ``paired``), judged by ``verdict.compare(..., paired=True)``.
    """
    from contextlib import nullcontext

    import torch

    device = model_device(module)
    if device is not None:
        example = tuple(e.to(device) if isinstance(e, torch.Tensor) else e for e in example)
    else:
        device = getattr(example[0], "device", None) if example else None
    with torch.inference_mode():
        with timing.track(device) as eager_first:
            module(*example)  # the eager first call: lazy initialisation
        compiled = torch.compile(module)
        with cache_variants.fresh_compile_cache() if fresh_cache else nullcontext(), timing.track(device) as first:
            compiled(*example)  # traces, generates code, builds it
        timed = timing.interleave({"eager": lambda: module(*example), "compiled": lambda: compiled(*example)},
                                  rounds=repeats, warmup=0, device=device)
    assert eager_first.seconds is not None and first.seconds is not None
    return {"eager_first_s": eager_first.seconds, "eager_s": timed["eager"].median,
            "compiled_first_s": first.seconds, "compiled_s": timed["compiled"].median, "repeats": repeats,
            "samples": {"eager_s": list(timed["eager"].samples), "compiled_s": list(timed["compiled"].samples)},
            "paired": True}


def break_even_calls(compiled_first_s: float, compiled_s: float, eager_first_s: float, eager_s: float) -> float | None:
    """Calls after which compiling has paid back its first call; None when compiled calls are not faster."""
    saved = eager_s - compiled_s
    if saved <= 0:
        return None
    return max(0.0, compiled_first_s - eager_first_s) / saved


# ---------------------------------------------------------------- frames and figures for the notebook

def requests_frame(**series: "ColdStart") -> Any:
    """One row per timed request of each process: ``requests_frame(cold=a, warmed=b)``."""
    import pandas as pd

    rows = [{"series": name, "request": i, "latency_s": e2e, "ttft_s": ttft}
            for name, cs in series.items() for i, (e2e, ttft) in enumerate(zip(cs.requests_s, cs.ttft_s), start=1)]
    return pd.DataFrame(rows)


def settle_figure(report: WarmupReport, title: str = "Warmup: latency per call and the spread of the last window"):
    """Latency per warmup call (bars) and the rolling window spread against the bar (line, right axis)."""
    import plotly.graph_objects as go

    calls = list(range(1, report.calls + 1))
    spreads = [None if s is None else 100 * s for s in window_spreads(report.latencies_s, report.window)]
    fig = go.Figure()
    fig.add_bar(x=calls, y=report.latencies_s, name="latency (s)")
    fig.add_scatter(x=calls, y=spreads, name=f"spread of last {report.window} (%)", yaxis="y2", mode="lines+markers")
    fig.add_scatter(x=calls, y=[100 * report.until_spread] * len(calls), name="settle bar (%)", yaxis="y2",
                    mode="lines", line={"dash": "dash"})
    fig.update_layout(title=title, xaxis_title="warmup call", yaxis_title="seconds", template="plotly_white",
                      yaxis2={"title": "spread (%)", "overlaying": "y", "side": "right", "rangemode": "tozero"})
    return fig


# ---------------------------------------------------------------- a truly cold start, in a child process

@dataclass
class ColdStart:
    """Phase timings (seconds) of one fresh process, and its request latencies in order."""

    process_start_s: float | None  # None when not spawned by cold_start (no spawn time to read)
    import_s: float
    cuda_init_s: float | None
    load_s: float
    requests_s: list[float]
    ttft_s: list[float]
    rss_bytes: dict[str, int]
    device: str
    torch_threads: int
    compile: bool
    max_new_tokens: int
    warmup: WarmupReport | None = None
    notes: dict[str, str] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # each timed request's greedy answer, in order
    # on a GPU, where the weights live: bytes by source ("cuda_allocated", "nvml"; None: not measurable) at the
    # points rss_bytes names
    gpu_bytes: dict[str, dict[str, int | None]] = field(default_factory=dict)

    @property
    def first_request_s(self) -> float:
        return self.requests_s[0]

    @property
    def second_request_s(self) -> float | None:
        return self.requests_s[1] if len(self.requests_s) > 1 else None

    def phases(self) -> dict[str, float | None]:
        return {"process_start_s": self.process_start_s, "import_s": self.import_s, "cuda_init_s": self.cuda_init_s,
                "load_s": self.load_s, "first_request_s": self.first_request_s,
                "second_request_s": self.second_request_s}

    def phases_frame(self):
        import pandas as pd

        rows = [{"phase": k.removesuffix("_s"), "seconds": v, "note": self.notes.get(k, "")}
                for k, v in self.phases().items()]
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["warmup"] = self.warmup.to_dict() if self.warmup else None
        return {**d, **self.phases()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ColdStart":
        keys = ("process_start_s", "import_s", "cuda_init_s", "load_s", "requests_s", "ttft_s", "rss_bytes", "device",
                "torch_threads", "compile", "max_new_tokens", "notes")
        w = data.get("warmup")
        return cls(**{k: data[k] for k in keys}, warmup=WarmupReport.from_dict(w) if w else None,
                   texts=list(data.get("texts", [])), gpu_bytes=dict(data.get("gpu_bytes", {})))


GROWTH_SOURCES = {"rss": "the process's resident set (RSS)", "cuda_allocated": "PyTorch's CUDA allocator",
                  "nvml": "the GPU's memory in use as NVML sees it (every process)"}


def gpu_point(device: str) -> dict[str, int | None]:
    """Device memory now, by source, on a CUDA ``device``: what ``cold_start_child`` records beside the RSS."""
    return {"cuda_allocated": memory.cuda_allocated(device).bytes, "nvml": memory.nvml_used(device).bytes}


def first_request_growth(cold: ColdStart) -> dict[str, int | None]:
    """What the first request added, by source, from after the load to after request 1: the RSS on a CPU; on a
    GPU the CUDA allocator and NVML (the weights live in device memory there: the RSS says nothing about them).
    None where a source could not be read. Keys name ``GROWTH_SOURCES``."""
    if cold.device.startswith("cuda"):
        before, after = cold.gpu_bytes.get("after_load", {}), cold.gpu_bytes.get("after_request_1", {})
        return {src: (after[src] - before[src] if before.get(src) is not None and after.get(src) is not None else None)
                for src in ("cuda_allocated", "nvml")}
    return {"rss": cold.rss_bytes["after_request_1"] - cold.rss_bytes["after_load"]}


def cold_start(name: str | None = None, *, dtype: str = "fp32", device: str | None = None, requests: int = 2,
               max_new_tokens: int = 8, prompt: str = DEFAULT_PROMPT, warm: bool = False,
               until_spread: float = 0.10, max_calls: int = 30, window: int = 5, compile: bool = False,
               timeout_s: float = 600) -> ColdStart:
    """Run a fresh ``python -m labkit cold-start`` and return its phase timings.

    ``warm=True`` runs ``warmup`` (until_spread / max_calls / window) before the timed requests;
    ``compile=True`` generates with a static cache and a torch.compile'd decode step.
    """
    if isinstance(requests, bool) or not isinstance(requests, int) or requests <= 0:
        raise ValueError(f"requests={requests!r}: must be a positive integer")
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be positive")
    if warm:
        _check_settle_args(until_spread, window, max_calls)
    cmd = [sys.executable, "-m", "labkit", "cold-start", "--dtype", dtype, "--requests", str(requests),
           "--max-new-tokens", str(max_new_tokens), "--prompt", prompt]
    if name:
        cmd += ["--model", name]
    if device:
        cmd += ["--device", device]
    if warm:
        cmd += ["--warm", "--until-spread", str(until_spread), "--max-calls", str(max_calls), "--window", str(window)]
    if compile:
        cmd.append("--compile")
    env = dict(os.environ)
    inductor_dir = tempfile.mkdtemp(prefix="labkit-inductor-") if compile else None
    if inductor_dir:
        env["TORCHINDUCTOR_CACHE_DIR"] = inductor_dir  # an empty compile cache: a truly cold compile
    env[SPAWN_ENV] = repr(time.time())
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=config.REPO_DIR)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the cold-start process ran past timeout_s={timeout_s}; raise it or lower requests") from None
    finally:
        if inductor_dir:
            shutil.rmtree(inductor_dir, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"cold-start process failed (exit {proc.returncode}):\n{tail}")
    return ColdStart.from_dict(json.loads(lines[-1]))


def cold_start_child(argv: list[str] | None = None) -> int:
    """The child side of ``cold_start``: time each phase in order, print one JSON line."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m labkit cold-start", description="time a cold start, print JSON")
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--device", default=None)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--warm", action="store_true", help="run warmup() before the timed requests")
    ap.add_argument("--until-spread", type=float, default=0.10)
    ap.add_argument("--max-calls", type=int, default=30)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="static cache + torch.compile'd decode step")
    args = ap.parse_args(argv)
    spawned = os.environ.get(SPAWN_ENV)
    notes = {"process_start_s": "interpreter start + `import labkit` (from the parent's spawn)",
             "import_s": "import torch, transformers",
             "load_s": "tokenizer + weights (+ the model's module code), moved to the device",
             "first_request_s": f"first generate of {args.max_new_tokens} tokens"}
    process_start = _SPAWNED_AT - float(spawned) if spawned else None

    with timing.track() as t_import:
        import torch
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    device = args.device or env.device()
    cuda_init = None
    if device.startswith("cuda"):
        with timing.track(device) as t_cuda:
            torch.zeros(1, device=device)  # creates the CUDA context: driver, runtime, allocator
        cuda_init = t_cuda.seconds
        notes["cuda_init_s"] = "CUDA context creation"
    else:
        notes["cuda_init_s"] = f"no CUDA context on {device}"
    rss = {"after_import": memory.rss().bytes}
    gpu: dict[str, dict[str, int | None]] = {}
    lm = models.load(args.model, dtype=args.dtype, device=device)
    rss["after_load"] = memory.rss().bytes
    if device.startswith("cuda"):
        gpu["after_load"] = gpu_point(device)
    kwargs: dict[str, Any] = {}
    if args.compile:
        kwargs = cache_variant_kwargs("static+compile")
        notes["first_request_s"] += ", compiling the decode step (static cache)"
    report = None
    if args.warm:
        report = warmup(lm.model, lm.tokenizer, until_spread=args.until_spread, max_calls=args.max_calls,
                        window=args.window, prompt=args.prompt, max_new_tokens=args.max_new_tokens, **kwargs)
        rss["after_warmup"] = memory.rss().bytes
        notes["first_request_s"] = f"first generate after warmup ({report.calls} calls)"
    latencies, ttfts, texts = [], [], []
    for i in range(args.requests):
        r = generation.generate(lm.model, lm.tokenizer, args.prompt, max_new_tokens=args.max_new_tokens,
                                fixed_length=True, **kwargs)
        latencies.append(r.e2e_s)
        ttfts.append(r.ttft_s)
        texts.append(r.text)
        if i < 2:
            rss[f"after_request_{i + 1}"] = memory.rss().bytes
            if device.startswith("cuda"):
                gpu[f"after_request_{i + 1}"] = gpu_point(device)
    result = ColdStart(process_start_s=process_start,
                       import_s=t_import.seconds or 0.0, cuda_init_s=cuda_init, load_s=lm.load_seconds,
                       requests_s=latencies, ttft_s=ttfts, rss_bytes=rss, device=device,
                       torch_threads=torch.get_num_threads(), compile=args.compile,
                       max_new_tokens=args.max_new_tokens, warmup=report, notes=notes, texts=texts, gpu_bytes=gpu)
    print(json.dumps(result.to_dict()))
    return 0

