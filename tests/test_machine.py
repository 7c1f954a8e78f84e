"""labkit.core.machine: the load line sees other processes' CPU, says BUSY above its threshold, and is stored."""
from __future__ import annotations

import subprocess
import sys
import time

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


def test_steal_or_load_alone_can_make_a_machine_busy():
    assert machine.Reading("t", 2, 0.1, steal=0.2, others_cores=0.0).busy
    no_proc = machine.Reading("t", 2, load_per_core=2.0, steal=None, others_cores=None)
    assert no_proc.busy and "unknown (no /proc)" in no_proc.line()
    assert not machine.Reading("t", 2, load_per_core=0.5, steal=None, others_cores=None).busy  # ourselves only


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
