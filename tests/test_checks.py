"""The shared checks: a positive count (``positive``) and a positive quantity (``positive_float``), each refusing
with the argument's name, and the callers that take a quantity refusing through it."""
from __future__ import annotations

import math

import numpy as np
import pytest

from labkit.core.checks import positive, positive_float
from labkit.lessons import cost
from labkit.model import hardware, parallel, roofline


@pytest.mark.parametrize("value", [1, 3, 10**12])
def test_a_positive_count_passes_as_it_is(value):
    assert positive("batch", value) == value


@pytest.mark.parametrize("value", [0, -2, 2.0, True, "4", None])
def test_anything_else_is_not_a_count(value):
    with pytest.raises(ValueError, match=r"^batch=.*: must be a positive integer$"):
        positive("batch", value)


@pytest.mark.parametrize("value, expected", [(0.25, 0.25), (3, 3.0), (np.float32(1.5), 1.5), (np.int64(7), 7.0),
                                             (1e-300, 1e-300)])
def test_a_positive_quantity_comes_back_as_a_float(value, expected):
    got = positive_float("bandwidth_gbs", value)
    assert got == expected and type(got) is float


@pytest.mark.parametrize("value", [0, 0.0, -1.5, math.nan, math.inf, -math.inf, True, False, "2.5", None,
                                   np.float64("nan"), [1.0]])
def test_zero_negative_not_finite_or_not_a_number_is_refused_naming_the_argument(value):
    with pytest.raises(ValueError, match=r"^bandwidth_gbs=.*: must be a positive number$"):
        positive_float("bandwidth_gbs", value)


def test_the_refusal_says_what_the_quantity_is():
    with pytest.raises(ValueError, match=r"gpu_memory_gib=-80: must be a positive number \(one GPU's memory"):
        parallel._memory(-80, None)


@pytest.mark.parametrize("call, name", [
    (lambda: roofline.ridge_intensity(100.0, 0), "peak_gflops"),
    (lambda: roofline.ridge_intensity(math.nan, 10.0), "bandwidth_gbs"),
    (lambda: roofline.roof_gflops(-1.0, 100.0, 1000.0), "intensity"),
    (lambda: roofline.bound(2.0, 0.0), "ridge"),
    (lambda: roofline.matmul_cost(1, 4, 4, 0), "bytes_per_value"),
    (lambda: cost.usd_per_million_tokens(100.0, math.inf), "hourly_usd"),
    (lambda: cost.cpu_as_if(None, 2, prices=[]), "per_core_tokens_per_s"),
    (lambda: hardware.decode_gap(0.05, 5e8, 0, 100, "cpu"), "bandwidth_gbs"),
    (lambda: hardware.decode_gap(0.05, 5e8, 20.0, 100, "cpu", matmul_s=-0.01), "matmul_s"),
])
def test_callers_refuse_a_quantity_through_the_one_check(call, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*: must be a positive number"):
        call()
