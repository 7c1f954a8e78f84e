"""How busy this machine is right now: the load line every notebook prints before it times anything.

A timing is only as good as the machine it ran on. ``read()`` samples the load average per core, the CPU
time the hypervisor stole (the steal time, on a Linux VM) and the other processes that used CPU
over a short window; ``check(where)`` prints that as one line, says plainly when timings will be
unreliable and what to close, and keeps every reading so ``env.environment()`` stores them with the
results. psutil reads the processes and the CPU times, on Linux and macOS alike (steal exists only on Linux;
macOS shows a user its own processes); where no process table can be read, only the load average is known
(``os.getloadavg``), and the line says so.

On a busy machine ``check`` also fits torch's intra-op threads to the cores other work leaves free
(``fit_threads``): a parallel region waits for its slowest thread, and a thread that shares its core with
a busy process makes every operator wait (measured here: a decode step 1.8× slower on 2 threads than on 1
beside two busy processes on 2 cores). It never raises the count above what torch started with, restores
it once the machine is quiet, and says so; ``LABKIT_FIT_THREADS=0`` turns it off.

``disk_bandwidth(folder, …)`` is the one reading of this machine's storage: how fast it reads back a file just
written to ``folder`` (the page cache serves it where memory allows, as it serves a KV tier's entry read back soon
after it was spilled), and the fixed start of one small read.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from . import timing
from .checks import positive
from .timing import clock

BUSY_SHARE = 0.25  # other processes using more than a quarter of the cores make timings unreliable
BUSY_STEAL = 0.05  # a hypervisor taking more than 5 % of the CPU time likewise
WINDOW_S = 0.5  # how long read() watches the other processes
TOP = 3  # the busiest processes the line names

_READINGS: list[dict[str, Any]] = []
_STARTED_THREADS: int | None = None  # torch's intra-op threads before fit_threads first changed them


@dataclass
class Reading:
    """One look at the machine: ``busy`` when other work takes enough CPU to move timings."""

    where: str
    cores: int
    load_per_core: float | None
    steal: float | None  # share of CPU time stolen over the window; None where the OS reports no steal
    others_cores: float | None  # CPU the other processes used over the window, in cores; None: no process table
    busiest: list[tuple[str, float]] = field(default_factory=list)  # (command, cores)
    time: float = 0.0

    @property
    def busy(self) -> bool:
        if self.others_cores is not None:
            busy = self.others_cores > BUSY_SHARE * self.cores
        else:  # no per-process view: the load average counts this process too, so allow one core for it
            busy = self.load_per_core is not None and self.load_per_core * self.cores > 1 + BUSY_SHARE * self.cores
        return busy or (self.steal is not None and self.steal > BUSY_STEAL)

    def line(self) -> str:
        parts = [f"load {self.load_per_core:.2f} per core" if self.load_per_core is not None else "load unknown",
                 f"{self.cores} cores"]
        if self.steal is not None:
            parts.append(f"steal {self.steal:.0%}")
        if self.others_cores is not None:
            top = ", ".join(f"{name} {cores:.1f}" for name, cores in self.busiest) or "none"
            parts.append(f"other processes {self.others_cores:.1f} cores (busiest: {top})")
        else:
            parts.append("other processes unknown (no process table)")
        verdict = "BUSY" if self.busy else "quiet"
        return f"Machine {verdict} at {self.where}: " + "; ".join(parts)

    def advice(self) -> str:
        if not self.busy:
            return ""
        what = ", ".join(name for name, _ in self.busiest) or "other programs"
        return (f"Timings will be unreliable: other work is using the CPU ({what}). Close it (a browser tab playing "
                "video, a build, a second notebook), wait for the load to drop, then rerun; until then read every "
                "ratio below as noise unless its verdict says otherwise.")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "busy": self.busy, "line": self.line()}


def cores() -> int:
    """The CPUs this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_BUSY_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")  # guest time is inside user


def _cpu_times() -> tuple[float, float] | None:
    """(total, steal) CPU seconds of the whole machine, or None where the OS reports no steal (only Linux does)."""
    times = psutil.cpu_times()
    steal = getattr(times, "steal", None)
    if steal is None:
        return None
    return sum(getattr(times, f, 0.0) for f in _BUSY_FIELDS), steal


def _own_family() -> set[int]:
    """This process and its ancestors: a notebook's kernel, its Jupyter server and the runner are the lab."""
    me = psutil.Process()
    try:
        parents = me.parents()[:8]
    except psutil.Error:
        parents = []
    return {me.pid, *(p.pid for p in parents if p.pid > 1)}


def _process_cpu() -> dict[int, tuple[str, float]]:
    """pid → (command name, user + system CPU seconds) for every process the OS lets us read (on macOS: this
    user's own)."""
    out: dict[int, tuple[str, float]] = {}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if times is not None:  # AccessDenied leaves it None
            out[proc.pid] = (proc.info["name"] or "?", times.user + times.system)
    return out


def _cmdline(pid: int, fallback: str) -> str:
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return fallback
    if not argv:
        return fallback
    words = [os.path.basename(argv[0])] + [a for a in argv[1:3] if not a.startswith("-")][:1]
    return " ".join(words)[:40]


def read(where: str = "now", window_s: float = WINDOW_S) -> Reading:
    """Look at the machine for ``window_s`` seconds: load average, steal and the other processes' CPU."""
    n_cores = cores()
    try:
        load: float | None = os.getloadavg()[0] / n_cores
    except (AttributeError, OSError):
        load = None
    try:
        before, stat0, t0 = _process_cpu(), _cpu_times(), clock()
        time.sleep(window_s)
        after, stat1, elapsed = _process_cpu(), _cpu_times(), clock() - t0
        mine = _own_family()
    except psutil.Error:  # no process table to read here: the load average alone
        return Reading(where, n_cores, load, None, None, [], time.time())
    used: list[tuple[int, str, float]] = []
    for pid, (name, seconds) in after.items():
        if pid in mine or pid not in before:
            continue
        cores_used = (seconds - before[pid][1]) / elapsed
        if cores_used > 0.01:
            used.append((pid, name, cores_used))
    used.sort(key=lambda u: -u[2])
    steal = None
    if stat0 and stat1 and stat1[0] > stat0[0]:
        steal = (stat1[1] - stat0[1]) / (stat1[0] - stat0[0])
    busiest = [(_cmdline(pid, name), round(c, 2)) for pid, name, c in used[:TOP] if c >= 0.05]
    return Reading(where, n_cores, load, steal, sum(u[2] for u in used), busiest, time.time())


def fit_threads(reading: Reading) -> str:
    """Fit torch's intra-op threads to the cores ``reading`` found free (see the module docstring); returns the
    sentence saying what changed, or "" when nothing did (no torch imported, no per-process view, turned off)."""
    global _STARTED_THREADS
    torch = sys.modules.get("torch")
    if torch is None or os.environ.get("LABKIT_FIT_THREADS", "1").strip() == "0" or reading.others_cores is None:
        return ""
    have = torch.get_num_threads()
    if _STARTED_THREADS is None:
        _STARTED_THREADS = have
    free = max(1, int(reading.cores - reading.others_cores + 0.5))
    want = min(_STARTED_THREADS, free) if reading.busy else _STARTED_THREADS
    if want == have:
        return ""
    torch.set_num_threads(want)
    if reading.busy:
        return (f"torch now runs {want} thread{'s' * (want != 1)} (it ran {have}): other work leaves {free} core"
                f"{'s' * (free != 1)} free, and a thread sharing a core with it slows every operator "
                "(LABKIT_FIT_THREADS=0 keeps the count).")
    return f"the machine is quiet again: torch runs {want} threads again (it ran {have})."


def check(where: str = "start", *, quiet: bool = False) -> Reading:
    """Print the load line (and, when busy, what to close); keep the reading for the results' environment.
    On a busy machine torch's threads are fitted to the free cores (``fit_threads``), and the line says so."""
    reading = read(where)
    timing.machine_busy = reading.busy  # what a noisy measurement's warning advises follows the load line
    fitted = fit_threads(reading)
    torch = sys.modules.get("torch")
    _READINGS.append({**reading.to_dict(), "torch_threads": torch.get_num_threads() if torch else None,
                      "threads_note": fitted})
    if not quiet:
        print(reading.line())
        if reading.busy:
            print(reading.advice())
        if fitted:
            print(fitted)
    return reading


def readings() -> list[dict[str, Any]]:
    """Every reading ``check`` took in this process, oldest first (stored in ``env.environment()``)."""
    return [dict(r) for r in _READINGS]


def busy_during() -> bool:
    """Whether any check in this process found the machine busy."""
    return any(r["busy"] for r in _READINGS)


def last_line() -> str:
    """The most recent load line, or a fresh one when nothing has been checked yet."""
    return _READINGS[-1]["line"] if _READINGS else check("now", quiet=True).line()


# ------------------------------------------------------------------------------------- storage


def _read_s(path: Path, data: bytes, repeats: int) -> float:
    path.write_bytes(data)
    try:
        seconds = []
        for _ in range(positive("repeats", repeats)):
            start = clock()
            path.read_bytes()
            seconds.append(clock() - start)
    finally:
        path.unlink(missing_ok=True)
    return statistics.median(seconds)


def disk_bandwidth(folder: str | Path, small_bytes: int, mib: int = 64, repeats: int = 3) -> dict[str, Any]:
    """Reading back files just written to ``folder`` (the tier's own path: the page cache serves them when memory
    allows, as it serves a spilled entry read back soon after), medians of ``repeats``: bytes/s of a ``mib`` MiB file,
    and the seconds of a ``small_bytes`` one (one token's KV: the fixed start of a reload)."""
    folder = Path(folder)
    big = _read_s(folder / "bandwidth.bin", os.urandom(positive("mib", mib) << 20), repeats)
    small = _read_s(folder / "start.bin", os.urandom(positive("small_bytes", small_bytes)), max(repeats, 9))
    return {"bytes": mib << 20, "read_s": big, "bytes_per_s": (mib << 20) / big, "start_s": small}
