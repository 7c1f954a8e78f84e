"""labkit.serve.processes: children die with their parent. A parent Python process spawns a child that starts a
grandchild in its group; the parent is then ended by SIGTERM or by SIGKILL, and no process of that group may be
alive 15 s later. Beside it: the watchdog leaves with its group, the SIGTERM handler never replaces one someone
installed, a spawn from a worker thread works, and ``stop_all`` gives every group its grace at the same time."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from processes import gone

from labkit.serve import processes

ROOT = Path(__file__).resolve().parent.parent
SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]

PARENT = """
import sys, time
from pathlib import Path
from labkit.serve import processes
grandchild = "import time; time.sleep(300)"
code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(300)"
child = processes.spawn("family", [sys.executable, "-c", code], "", log_dir=Path(sys.argv[1]))
print(child.proc.pid, child.watchdog.pid, flush=True)
time.sleep(300)
"""


def alive_in_group(pgid: int) -> list[int]:
    """The group's live members: none once ``killpg(pgid, 0)`` finds no process, or only zombies (ended, waiting
    for a reaper: a container's init may never reap them)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    return processes.group_pids(pgid)


def wait_until(condition, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def family(tmp_path):
    """A parent that spawned a child (a group leader) which started a grandchild; yields (parent, pgid,
    watchdog pid, log); whatever the test finds, everything it started is killed afterwards."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT)
    pgid = watchdog = None
    try:
        pgid, watchdog = map(int, parent.stdout.readline().split())
        assert wait_until(lambda: len(alive_in_group(pgid)) == 2, 20), "the child and its grandchild started"
        yield parent, pgid, watchdog, tmp_path / "family.log"
    finally:
        parent.kill()
        parent.wait(10)
        parent.stdout.close()
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        if watchdog is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(watchdog, signal.SIGKILL)


def test_a_parent_ended_by_sigterm_stops_its_childrens_groups_before_it_exits(family, alarm):
    parent, pgid, watchdog, log = family
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(15) == -signal.SIGTERM, "the parent ends as SIGTERM ends a process"
    assert not alive_in_group(pgid), "the handler stopped the group (grandchild included) before the parent exited"
    assert "watchdog:" not in log.read_text(), "the handler did it, not the watchdog"
    assert gone(watchdog), "and ended the group's watchdog"


def test_a_parent_ended_by_sigkill_leaves_its_childrens_groups_to_the_watchdog(family, alarm):
    parent, pgid, watchdog, log = family
    parent.send_signal(signal.SIGKILL)
    parent.wait(15)
    assert wait_until(lambda: not alive_in_group(pgid), 15), f"group {pgid} still has {alive_in_group(pgid)}"
    assert "is gone: stopping process group" in log.read_text()
    assert gone(watchdog, within_s=5), "the watchdog exits once the group is stopped"


def test_the_watchdog_leaves_with_its_group(tmp_path, alarm):
    stopped = processes.spawn("sleeper", SLEEP, "", log_dir=tmp_path)
    assert stopped.watchdog is not None and stopped.watchdog.poll() is None
    stopped.stop(grace_s=2.0)
    assert gone(stopped.watchdog.pid), "stop ends the watchdog"
    quits = processes.spawn("quits", [sys.executable, "-c", "pass"], "", log_dir=tmp_path)
    assert wait_until(lambda: not quits.alive(), 10)  # its exit seen (and the leader reaped)
    assert wait_until(lambda: quits.watchdog.poll() is not None, 5), "a group that ends alone takes its watchdog"
    quits.stop()


def test_the_sigterm_handler_never_replaces_one_already_installed_nor_needs_the_main_thread(tmp_path, alarm):
    def theirs(signum, frame):
        raise AssertionError("not sent in this test")

    before = signal.signal(signal.SIGTERM, theirs)
    children = []
    try:
        children.append(processes.spawn("sleeper", SLEEP, "", log_dir=tmp_path, log_name="main"))
        assert signal.getsignal(signal.SIGTERM) is theirs
        worker = threading.Thread(target=lambda: children.append(
            processes.spawn("sleeper", SLEEP, "", log_dir=tmp_path, log_name="thread")))
        worker.start()
        worker.join(30)
        assert len(children) == 2 and children[1].alive() and children[1].watchdog.poll() is None
    finally:
        processes.stop_all(children, grace_s=2.0)
        signal.signal(signal.SIGTERM, before)
    assert all(gone(c.proc.pid) and gone(c.watchdog.pid) for c in children)


def test_stop_all_gives_every_group_its_grace_at_once(tmp_path, alarm):
    deaf = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('deaf' + ' now', flush=True); time.sleep(300)"]
    children = [processes.spawn("deaf", deaf, "", log_dir=tmp_path, log_name=f"deaf{i}") for i in range(3)]
    assert wait_until(lambda: all("deaf now" in c.log() for c in children), 20)
    t0 = time.monotonic()
    processes.stop_all(children, grace_s=1.0)
    assert time.monotonic() - t0 < 2.5, "one grace for all three, not one after another"
    assert all(gone(c.proc.pid) for c in children) and not set(children) & processes._LIVE
