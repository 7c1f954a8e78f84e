"""labkit.core.machine: the load line sees other processes' CPU, says BUSY above its threshold, and is stored."""
from __future__ import annotations

import subprocess
import sys
import time

from labkit.core import env, machine


def test_a_cpu_hog_beside_us_makes_the_machine_busy_and_is_named():
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
