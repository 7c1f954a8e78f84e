"""One supervisor for every long-running child the lab starts: ``vllm serve``, the replicas of ``labkit serve``, the
router in front of them, and the lab's own server in a process of its own.

``spawn`` starts a command in a process group of its own (``start_new_session``), its stdout and stderr in a log
file; ``wait_ready(child, ready, deadline_s, what)`` polls ``ready()`` until it holds, and raises ``StartError``
(or the caller's subclass) carrying the log's error line when the process exits first or the deadline passes,
stopping the child whatever goes wrong; ``Child.stop`` sends SIGTERM to the whole group and SIGKILL after a
grace; every child not yet stopped is stopped at interpreter exit. Beside it, the helpers every launcher shares:
free ports and a port check, a process group's live members, terminal colour codes stripped from a log and the
log's error line.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..core import config

_LIVE: set["Child"] = set()  # children not yet stopped: stopped at interpreter exit too
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
    """A child process in a process group of its own (``start_new_session``), its output in ``log_path``."""

    stop_grace_s = 10.0  # SIGTERM, then SIGKILL after this long

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

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM to the group, SIGKILL after ``grace_s`` (default ``stop_grace_s``); the exit status (None if it
        would not die)."""
        _LIVE.discard(self)
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        pgid = self.proc.pid  # start_new_session: the group's id is the leader's pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and group_alive(pgid):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        return self.proc.returncode


def spawn(name: str, argv: list[str], url: str, *, log_dir: Path, child_env: Mapping[str, str] | None = None,
          cwd: Path | None = None, log_name: str | None = None, kind: type[C] = Child) -> C:  # type: ignore[assignment]
    """Start ``argv`` in a process group of its own, stdout and stderr into ``log_dir/(log_name or name).log``."""
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"{log_name or name}.log"
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(child_env) if child_env is not None else None, start_new_session=True,
                                cwd=cwd)
    child = kind(name, argv, url, log_path, proc)
    _LIVE.add(child)
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


def stop_all(children: Sequence[Child]) -> None:
    """Stop every child, each whatever the others do."""
    for child in children:
        with contextlib.suppress(Exception):
            child.stop()


@atexit.register
def _stop_live() -> None:
    stop_all(list(_LIVE))
