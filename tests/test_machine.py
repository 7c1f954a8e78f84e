"""labkit.core.machine: the load line sees other processes' CPU, says BUSY above its threshold, and is stored."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from labkit.core import env, machine


def test_a_cpu_hog_beside_us_makes_the_machine_busy_and_is_named(monkeypatch):
    monkeypatch.setenv("LABKIT_FIT_THREADS", "0")  # the other tests keep their threads
    quiet = machine.Reading("t", cores=2, load_per_core=0.1, steal=0.0, others_cores=0.1, busiest=[("x", 0.1)])
    assert not quiet.busy and quiet.advice() == "" and quiet.line().startswith("Machine quiet at t: load 0.10")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        reading = machine.check("hogged")
    finally:
        hog.kill()
    assert reading.busy and reading.others_cores >= 0.6, reading.line()
    assert any(name.startswith("python") for name, _ in reading.busiest), reading.busiest
    assert "BUSY" in reading.line() and "Close it" in reading.advice()
    stored = env.environment()["machine"]
    assert stored[-1]["where"] == "hogged" and stored[-1]["busy"] and machine.busy_during()
    from labkit.core import timing

    assert timing.machine_busy is True, "a noisy measurement now advises closing programs"
    monkeypatch.setattr(machine, "read", lambda where="now", window_s=0: quiet)
    machine.check("quiet again", quiet=True)
    assert timing.machine_busy is False


def test_steal_or_load_alone_can_make_a_machine_busy():
    assert machine.Reading("t", 2, 0.1, steal=0.2, others_cores=0.0).busy
    no_proc = machine.Reading("t", 2, load_per_core=2.0, steal=None, others_cores=None)
    assert no_proc.busy and "unknown (no process table)" in no_proc.line()
    assert not machine.Reading("t", 2, load_per_core=0.5, steal=None, others_cores=None).busy  # ourselves only


class FakeMacPsutil:
    """psutil as a Mac shows it: no steal in the CPU times, other users' processes denied, this user's readable."""

    Error = AccessDenied = psutil.AccessDenied

    def __init__(self, hog_pid: int) -> None:
        self.hog_pid, self.calls = hog_pid, 0

    def cpu_times(self):
        return SimpleNamespace(user=1.0, nice=0.0, system=1.0, idle=10.0)  # macOS: no steal, no iowait

    def process_iter(self, attrs):
        self.calls += 1
        hog = SimpleNamespace(pid=self.hog_pid, info={"name": "python3.11", "cpu_times": SimpleNamespace(
            user=10.0 + 0.45 * self.calls, system=0.0)})  # about 0.9 of a core over the 0.5 s window
        root = SimpleNamespace(pid=1, info={"name": "launchd", "cpu_times": None})  # another user's: denied
        return [hog, root]

    def Process(self, pid=None):  # noqa: N802 (psutil's name)
        if pid is None:
            return SimpleNamespace(pid=os.getpid(), parents=lambda: [])
        return SimpleNamespace(pid=pid, cmdline=lambda: ["/usr/local/bin/python3.11", "hog.py"])


def test_the_load_line_names_a_busy_process_on_macos_too(monkeypatch):
    """The per-process view comes from psutil, so a Mac (no /proc) gets the busy line and the process's name."""
    monkeypatch.setattr(machine, "psutil", FakeMacPsutil(hog_pid=4242))
    reading = machine.read("mac")
    assert reading.steal is None and reading.others_cores is not None and reading.others_cores > 0.5
    assert reading.busy and reading.busiest[0][0] == "python3.11 hog.py", reading.busiest
    assert "steal" not in reading.line() and "BUSY" in reading.line()


def test_a_busy_machine_fits_torch_threads_to_the_free_cores_and_a_quiet_one_restores_them(monkeypatch):
    import torch

    monkeypatch.setattr(machine, "_STARTED_THREADS", None)
    set_to = []
    threads = {"n": 4}
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads["n"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (set_to.append(n), threads.update(n=n)))
    busy = machine.Reading("t", cores=4, load_per_core=2.0, steal=0.0, others_cores=2.6)
    said = machine.fit_threads(busy)
    assert set_to == [1] and "torch now runs 1 thread (it ran 4)" in said and "1 core free" in said
    assert machine.fit_threads(busy) == "" and set_to == [1]  # already fitted
    quiet = machine.Reading("t", cores=4, load_per_core=0.1, steal=0.0, others_cores=0.1)
    assert "runs 4 threads again" in machine.fit_threads(quiet) and set_to == [1, 4]
    half = machine.Reading("t", cores=4, load_per_core=1.0, steal=0.0, others_cores=2.0)
    machine.fit_threads(half)
    assert set_to[-1] == 2  # never more than it started with, never fewer than one
    monkeypatch.setenv("LABKIT_FIT_THREADS", "0")
    assert machine.fit_threads(quiet) == "" and set_to[-1] == 2
    monkeypatch.delenv("LABKIT_FIT_THREADS")
    assert machine.fit_threads(machine.Reading("t", 4, 2.0, None, others_cores=None)) == ""  # no /proc: unknown


def test_the_last_level_cache_is_read_from_sysfs_then_lscpu_then_assumed(tmp_path):
    """The fusion demo needs one size above the last-level cache: the highest data/unified level wins, an
    instruction cache never does, and a machine that says nothing gets 64 MiB, labelled as assumed."""
    from labkit.core import cpu

    for name, level, kind, size in (("index0", 1, "Data", "32K"), ("index1", 1, "Instruction", "32K"),
                                    ("index2", 2, "Unified", "512K"), ("index3", 3, "Unified", "32768K")):
        (tmp_path / name).mkdir()
        for f, v in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / name / f).write_text(f"{v}\n")
    assert cpu.llc(str(tmp_path)) == (32 * 2**20, f"L3 cache of CPU 0, from {tmp_path}")
    lscpu = "L1d cache:    65536 (2 instances)\nL1i cache:    65536 (2 instances)\nL2 cache:     1048576 (2 instances)\n"
    size, source = cpu.llc(str(tmp_path / "none"), lscpu=lscpu)
    assert size == 2**20 and source.startswith("L2 cache, from lscpu")
    assert cpu.llc(str(tmp_path / "none"), lscpu="") == (64 * 2**20, "no cache size readable here: 64 MiB assumed")


def test_disk_bandwidth_reads_back_what_it_wrote_and_leaves_nothing(tmp_path):
    got = machine.disk_bandwidth(tmp_path, small_bytes=4096, mib=1, repeats=2)
    assert got["bytes"] == 1 << 20 and got["read_s"] > 0 and got["start_s"] > 0
    assert got["bytes_per_s"] == pytest.approx((1 << 20) / got["read_s"])
    assert list(tmp_path.iterdir()) == [], "the probe's files are removed"
    with pytest.raises(ValueError, match="repeats"):
        machine.disk_bandwidth(tmp_path, small_bytes=4096, mib=1, repeats=0)
