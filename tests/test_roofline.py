"""labkit.model.roofline: matmul cost and intensity, the traffic of a model's linear layers, the roofs and the ridge."""
from __future__ import annotations

import pytest

from labkit.model import roofline


def test_matmul_cost_and_intensity():
    flops, moved = roofline.matmul_cost(1, 49152, 576, 4)
    assert flops == 2 * 49152 * 576 and moved == (49152 * 576 + 576 + 49152) * 4
    assert roofline.matmul_intensity(1, 4096, 4096, 2) < 1 < roofline.matmul_intensity(512, 4096, 4096, 2)
    with pytest.raises(ValueError, match="tokens"):
        roofline.matmul_cost(0, 8, 8, 4)
    with pytest.raises(ValueError, match="bytes_per_value"):
        roofline.matmul_cost(1, 8, 8, 0)


def test_linear_traffic_counts_every_linear_and_the_head_rows():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 4, bias=False))
    flops, moved = roofline.linear_traffic(model, 3)
    assert flops == 2 * 3 * (8 * 16 + 16 * 4)
    assert moved == 4 * (8 * 16 + 3 * 8 + 3 * 16) + 4 * (16 * 4 + 3 * 16 + 3 * 4)


def test_roofline_roofs_and_ridge():
    assert roofline.ridge_intensity(10, 100) == 10
    assert roofline.roof_gflops(0.5, 10, 100) == 5  # under the ridge: the bandwidth slope
    assert roofline.roof_gflops(50, 10, 100) == 100  # above it: the compute flat
    with pytest.raises(ValueError):
        roofline.roof_gflops(0, 10, 100)
    with pytest.raises(ValueError):
        roofline.ridge_intensity(0, 100)
