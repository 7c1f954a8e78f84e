"""One supervisor for every long-running child the lab starts: ``vllm serve``, the replicas of ``labkit serve``, the
router in front of them, and the lab's own server in a process of its own.

``spawn`` starts a command in a process group of its own (``start_new_session``), its stdout and stderr in a log
file; ``wait_ready(child, ready, deadline_s, what)`` polls ``ready()`` until it holds, and raises ``StartError``
(or the caller's subclass) carrying the log's error line when the process exits first or the deadline passes,
stopping the child whatever goes wrong; ``Child.stop`` sends SIGTERM to the whole group and SIGKILL after a
grace. Children die with the Python process that started them, and so does everything in their groups: every child
not yet stopped is stopped at interpreter exit (a normal exit, Ctrl-C), on SIGTERM (a handler, installed where
SIGTERM still had its default action and only from the main thread, stops the groups and then ends the process as
SIGTERM would), and on SIGKILL or any other death (a watchdog beside each group, a small process that polls its
parent and, once the parent is gone, sends the group SIGTERM and SIGKILL ``ORPHAN_GRACE_S`` later; it exits when
the group is stopped). Beside it, the helpers every launcher shares: free ports and a port check, a process
group's live members and the CPU they use (``CpuTrace``), terminal colour codes stripped from a log and the log's
error line.
"""
from __future__ import annotations

import atexit
import contextlib
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from types import FrameType
from typing import IO, Any, TypeVar

from ..core import config
from ..core.timing import clock

_LIVE: set["Child"] = set()  # children not yet stopped: stopped at interpreter exit and on SIGTERM too
ORPHAN_GRACE_S = 5.0  # the parent gone (SIGTERM, SIGKILL): no one waits for answers, so SIGKILL after this long
WATCH_POLL_S = 0.5  # how often a watchdog looks for its parent
C = TypeVar("C", bound="Child")


class StartError(RuntimeError):
    """A child exited, or was not ready within its deadline; the message carries its log's error line."""


# ---------------------------------------------------------------------------------------- ports


def check_port(port: int, error: type[Exception] = StartError) -> None:
    """``error`` (one line) when 127.0.0.1:``port`` cannot be bound."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise error(f"port {port} on 127.0.0.1 is in use ({exc.strerror}): pick another port, "
                        "or leave the port unset for a free one") from None


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


# ---------------------------------------------------------------------------------------- logs

_ERROR = re.compile(r"(Error|\bERROR\b|Exception|Illegal instruction|Killed|Traceback|error:|CRITICAL|FATAL)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_colour(text: str) -> str:
    """``text`` without terminal colour codes (smg colours its log even into a file)."""
    return _ANSI.sub("", text)


def last_error_line(log_text: str) -> str:
    """The log's last line that names an error (else its last line), without terminal colour codes."""
    lines = [ln.strip() for ln in strip_colour(log_text).splitlines() if ln.strip()]
    errors = [ln for ln in lines if _ERROR.search(ln) and not ln.startswith("Traceback")]
    return (errors or lines or ["(empty log)"])[-1][:400]


# ---------------------------------------------------------------------------------------- process groups


def group_pids(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, through psutil (Linux and macOS)."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
    return pids


class CpuTrace:
    """The CPU seconds (user + system) a process group has used, sampled every ``every_s`` on a thread between
    ``start()`` and ``stop()`` (psutil): ``rows`` of (epoch s, monotonic s, CPU s). A member that exits keeps the
    CPU last read from it; the members are looked up again every ``refresh`` samples. ``at(t, clock)`` reads the
    CPU used by time ``t`` on either clock (``time.time``: "epoch"; ``timing.clock``: "monotonic", one clock for
    every process on Linux), linear between samples."""

    def __init__(self, pgid: int, every_s: float = 0.05, refresh: int = 10) -> None:
        self.pgid, self.every_s, self.refresh = pgid, every_s, refresh
        self.rows: list[tuple[float, float, float]] = []
        self._seen: dict[int, float] = {}
        self._procs: dict[int, Any] = {}
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"cpu-trace-{pgid}", daemon=True)

    def start(self) -> "CpuTrace":
        self._sample(True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        self._thread.join()
        self._sample(False)

    def _loop(self) -> None:
        n = 0
        while not self._halt.wait(self.every_s):
            n += 1
            self._sample(n % self.refresh == 0)

    def _sample(self, look_up: bool) -> None:
        import psutil

        if look_up:
            for pid in group_pids(self.pgid):
                if pid not in self._procs:
                    with contextlib.suppress(psutil.Error):
                        self._procs[pid] = psutil.Process(pid)
        for pid, proc in list(self._procs.items()):
            try:
                t = proc.cpu_times()
                self._seen[pid] = max(self._seen.get(pid, 0.0), t.user + t.system)
            except psutil.Error:
                del self._procs[pid]  # gone: it keeps what it was last seen using
        self.rows.append((time.time(), clock(), sum(self._seen.values())))

    def at(self, t: float, clock: str = "epoch") -> float:
        """CPU seconds the group had used by time ``t`` (``clock``: "epoch" or "monotonic")."""
        if clock not in ("epoch", "monotonic"):
            raise ValueError(f"clock={clock!r}: 'epoch' (time.time) or 'monotonic' (labkit.core.timing.clock)")
        if not self.rows:
            raise RuntimeError("CpuTrace.at(): nothing sampled yet; start() it first")
        i = 0 if clock == "epoch" else 1
        rows = self.rows
        if t <= rows[0][i]:
            return rows[0][2]
        for a, b in zip(rows, rows[1:]):
            if t <= b[i]:
                w = (t - a[i]) / (b[i] - a[i]) if b[i] > a[i] else 1.0
                return a[2] + w * (b[2] - a[2])
        return rows[-1][2]


def pin_group(pgid: int, cores: set[int]) -> int:
    """Hold every thread of every live process in the group to ``cores`` (Linux: affinity is per thread, so each
    one in ``/proc/PID/task``); threads started later inherit it. Returns how many threads were pinned (0 where the
    OS offers no affinity)."""
    if not cores:
        raise ValueError("cores: name at least one CPU")
    if not hasattr(os, "sched_setaffinity") or not Path("/proc").is_dir():
        return 0
    pinned = 0
    for pid in group_pids(pgid):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), cores)
                pinned += 1
    return pinned


def group_alive(pgid: int) -> bool:
    """Whether a process group still has a live member (a zombie leader alone counts as gone)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_pids(pgid))


class Child:
    """A child process in a process group of its own (``start_new_session``), its output in ``log_path``, and the
    watchdog that ends the group if this process dies first."""

    stop_grace_s = 10.0  # SIGTERM, then SIGKILL after this long
    watchdog: subprocess.Popen | None = None

    def __init__(self, name: str, argv: list[str], url: str, log_path: Path, proc: subprocess.Popen) -> None:
        self.name, self.argv, self.url, self.log_path, self.proc = name, argv, url, log_path, proc

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.url} {'running' if self.alive() else 'stopped'}>"

    def log(self) -> str:
        """The log so far, colour codes removed."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
        return strip_colour(text)

    def error_line(self) -> str:
        return last_error_line(self.log())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def get(self, path: str, timeout_s: float = 5.0) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as resp:  # 127.0.0.1 only
            return resp.read().decode("utf-8")

    def post(self, path: str, body: Mapping[str, Any] | None = None, timeout_s: float = 10.0) -> Any:
        req = urllib.request.Request(self.url + path, data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8") or "null")

    def kill(self) -> None:
        """SIGKILL the whole group now, as a crash would (the fault a router must survive)."""
        _LIVE.discard(self)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._end_watchdog()

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM to the group, SIGKILL after ``grace_s`` (default ``stop_grace_s``); the exit status (None if it
        would not die)."""
        return self._finish(self._terminate(grace_s))

    def _terminate(self, grace_s: float | None) -> float:
        """SIGTERM to the group; the moment its grace ends."""
        _LIVE.discard(self)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)  # start_new_session: the group's id is the leader's pid
        return time.monotonic() + (self.stop_grace_s if grace_s is None else grace_s)

    def _finish(self, end: float) -> int | None:
        """Wait for the group until ``end``, then SIGKILL what is left; the exit status."""
        pgid = self.proc.pid
        while time.monotonic() < end and group_alive(pgid):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._end_watchdog()
        return self.proc.returncode

    def _end_watchdog(self) -> None:
        """The group is stopped: its watchdog has nothing left to guard."""
        if self.watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                self.watchdog.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watchdog.wait(5)


# ---------------------------------------------------------------------------------- children die with their parent


def _watch(parent: int, pgid: int, grace_s: float, poll_s: float) -> None:
    """A watchdog's loop, run in a small process of its own beside a group (``python -c`` with this function's
    source, the standard library only): once ``parent`` is gone (this process has a new parent), SIGTERM to the
    group and SIGKILL ``grace_s`` later; once the group is gone, return."""
    def group_gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    while not group_gone():
        if os.getppid() != parent:
            print(f"watchdog: process {parent}, which started this group, is gone: stopping process group {pgid}",
                  flush=True)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            end = time.monotonic() + grace_s
            while time.monotonic() < end and not group_gone():
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            return
        time.sleep(poll_s)


@cache
def _watchdog_source() -> str:
    """The watchdog's program: ``_watch`` and the call that reads its arguments."""
    return ("import contextlib, os, signal, sys, time\n" + inspect.getsource(_watch)
            + "\n_watch(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))\n")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM: every child's group stopped together (SIGKILL after ``ORPHAN_GRACE_S``), then the process ends as
    SIGTERM ends it (exit status 128 + 15)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once; the watchdogs finish
    stop_all(list(_LIVE), grace_s=ORPHAN_GRACE_S)
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(128 + signal.SIGTERM)  # not reached where the signal ends the process, as it does on Linux and macOS


def _take_sigterm() -> None:
    """Install ``_on_sigterm`` where SIGTERM still has its default action: never over a handler someone installed
    (theirs runs, or SIG_IGN holds, and the watchdogs end the groups once the process is gone), and only from the
    main thread (``signal.signal`` raises anywhere else). A Jupyter kernel leaves SIGTERM at its default."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        with contextlib.suppress(ValueError):  # not the main interpreter
            signal.signal(signal.SIGTERM, _on_sigterm)


def _forget_after_fork() -> None:
    """A forked copy of this process owns none of its children: neither its exit nor its SIGTERM stops them."""
    _LIVE.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _popen(argv: list[str], log: IO[str], env: Mapping[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.Popen:
    """The one place a long-running child starts: a process group of its own, output into ``log``, no stdin."""
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=dict(env) if env is not None else None, start_new_session=True, cwd=cwd)


def spawn(name: str, argv: list[str], url: str, *, log_dir: Path, child_env: Mapping[str, str] | None = None,
          cwd: Path | None = None, log_name: str | None = None, kind: type[C] = Child) -> C:  # type: ignore[assignment]
    """Start ``argv`` in a process group of its own, stdout and stderr into ``log_dir/(log_name or name).log``."""
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"{log_name or name}.log"
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = _popen(argv, log, child_env, cwd)
        child = kind(name, argv, url, log_path, proc)
        _LIVE.add(child)
        _take_sigterm()
        try:  # beside the group, in a session of its own: neither the group's signals nor a terminal's reach it
            child.watchdog = _popen([sys.executable, "-I", "-S", "-c", _watchdog_source(), str(os.getpid()),
                                     str(proc.pid), str(ORPHAN_GRACE_S), str(WATCH_POLL_S)], log)
        except BaseException:
            child.stop(grace_s=0.0)
            raise
    return child


def wait_ready(child: Child, ready: Callable[[], bool], deadline_s: float, what: str, poll_s: float = 0.25,
               error: type[StartError] = StartError) -> float:
    """Seconds until ``ready()`` held; ``error`` with the log's error line when the process exits first or
    ``deadline_s`` passes. Whatever goes wrong (KeyboardInterrupt included), the child is stopped."""
    t0 = time.monotonic()
    try:
        while True:
            if not child.alive():
                raise error(f"{child.name} exited with {child.proc.returncode} before {what}: "
                            f"{child.error_line()} (log: {config.shown(child.log_path)})")
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
                if ready():
                    return time.monotonic() - t0
            if time.monotonic() - t0 > deadline_s:
                raise error(f"{child.name} did not {what} within {deadline_s:.0f} s: {child.error_line()} "
                            f"(log: {config.shown(child.log_path)})")
            time.sleep(poll_s)
    except BaseException:
        child.stop(grace_s=2.0)
        raise


def wait_for(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.2) -> float | None:
    """Seconds until ``condition()`` held, or None when ``timeout_s`` passed first (a fault's recovery, timed)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 <= timeout_s:
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
            if condition():
                return time.monotonic() - t0
        time.sleep(poll_s)
    return None


def stop_all(children: Sequence[Child], grace_s: float | None = None) -> None:
    """Stop every child, each whatever the others do: SIGTERM to every group at once, then SIGKILL to each one
    still alive after its grace (``grace_s``, else the child's ``stop_grace_s``)."""
    ends = []
    for child in children:
        with contextlib.suppress(Exception):
            ends.append((child, child._terminate(grace_s)))
    for child, end in ends:
        with contextlib.suppress(Exception):
            child._finish(end)


@atexit.register
def _stop_live() -> None:
    stop_all(list(_LIVE))
