"""labkit.model.hardware: the bandwidth and matmul probes measure on the CPU and refuse sizes too small to mean anything."""
from __future__ import annotations

import pytest

from labkit.model import hardware


def test_bandwidth_probe_small_and_guarded():
    r = hardware.bandwidth(device="cpu", size_bytes=64 * 2**20, repeats=3)
    assert r.gbs > 0.1 and r.read.n == 3
    assert r.gbs >= r.median_gbs  # best is at least the median
    with pytest.raises(ValueError, match="at least 4 MiB"):
        hardware.bandwidth(device="cpu", size_bytes=1024)


def test_matmul_probe():
    r = hardware.matmul_flops(device="cpu", n=256, repeats=3)
    assert r.tflops > 0
    with pytest.raises(ValueError):
        hardware.matmul_flops(device="cpu", n=0)
