"""labkit.precision.libraries: ONNX Runtime's int8 matmul error, and which bitsandbytes kernel a layer runs,
read from the operators that ran."""
from __future__ import annotations

import pytest
import torch
from test_quantisers import _weight

from labkit.core import env
from labkit.precision import libraries


def test_ort_matmul_error_is_small_for_plain_weights():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(32, 64, generator=g) * 0.05, torch.randn(16, 64, generator=g)
    assert libraries.ort_matmul_error(w, x, per_channel=False, reduce_range=True) < 0.05
    assert libraries.ort_matmul_error(w, x, per_channel=True, reduce_range=True) < 0.05


def test_bnb_route_reads_the_operators_that_ran():
    assert "_int_mm" in libraries.bnb_route("int8", ["bitsandbytes::int8_linear_matmul", "aten::_int_mm"], "cpu")
    assert "fp32" in libraries.bnb_route("int8", ["bitsandbytes::int8_linear_matmul", "aten::mm"], "cpu")
    assert "CUDA" in libraries.bnb_route("int8", ["bitsandbytes::int8_linear_matmul"], "cuda:0")
    cuda_other = libraries.bnb_route("int8", ["aten::mm", "aten::matmul"], "cuda:0")  # the label follows what ran
    assert "CUDA" not in cuda_other and cuda_other.startswith("no bitsandbytes int8 operator seen")
    assert "dequantised" in libraries.bnb_route("nf4", ["bitsandbytes::dequantize_4bit", "aten::mm"], "cpu")
    assert "fused" in libraries.bnb_route("nf4", ["bitsandbytes::gemv_4bit"], "cpu")
    with pytest.raises(ValueError, match="int8"):
        libraries.bnb_route("fp8", [], "cpu")


def test_bnb_route_names_both_routes_of_cuda_gemm_4bit():
    """bitsandbytes 0.50 on CUDA dispatches bitsandbytes::gemm_4bit for every 4-bit matmul; inside it either runs its
    fused kernel (a ctypes call: no float matmul operator) or dequantises and calls F.linear."""
    fused_ops = ["aten::to", "aten::view", "bitsandbytes::gemm_4bit", "aten::empty"]  # a decode step: M = 1
    fused = libraries.bnb_route("nf4", fused_ops, "cuda:0")
    assert "gemm_4bit" in fused and "fused" in fused and "no bitsandbytes 4-bit operator" not in fused
    unfused = libraries.bnb_route("nf4", [*fused_ops, "aten::linear", "aten::t", "aten::addmm"], "cuda:0")
    assert "gemm_4bit" in unfused and "dequantise" in unfused and "fused route" not in unfused
    # the CPU's default gemm_4bit dequantises through the registered op: named as before
    cpu = libraries.bnb_route("nf4", ["bitsandbytes::gemm_4bit", "bitsandbytes::dequantize_4bit", "aten::linear"], "cpu")
    assert "bitsandbytes::dequantize_4bit" in cpu


def test_the_installed_bitsandbytes_dispatches_gemm_4bit_on_cuda():
    """The operator names bnb_route reads are those the installed bitsandbytes registers for CUDA (read from its
    source: its CUDA backend does not import without a GPU)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("bitsandbytes")
    if spec is None or spec.origin is None:
        pytest.skip("bitsandbytes is not installed")
    root = Path(spec.origin).parent
    cuda_ops = (root / "backends" / "cuda" / "ops.py").read_text(encoding="utf-8")
    assert '@register_kernel("bitsandbytes::gemm_4bit", "cuda")' in cuda_ops
    assert "_GEMM_4BIT_CUSTOM_FLOOR_M = 4" in cuda_ops  # the fused kernel always runs for M <= 4
    assert "torch.nn.functional.linear(A, B_dq, bias)" in cuda_ops  # the other route: dequantise, then F.linear
    autograd = (root / "autograd" / "_functions.py").read_text(encoding="utf-8")
    assert "torch.ops.bitsandbytes.gemm_4bit.default(" in autograd.split("def matmul_4bit")[1]


def test_bnb_layer_reports_the_kernel_this_machine_runs():
    if not env.capability("bitsandbytes").available:
        pytest.skip(env.capability("bitsandbytes").reason)
    w = _weight()
    for kind in ("int8", "nf4"):
        ops = libraries.ops_called(libraries.bnb_layer(w, kind), torch.randn(1, 1, 128))
        assert any(o.startswith("bitsandbytes::") for o in ops), ops
    cond = libraries.bnb_cpu_conditions()
    int8_ops = libraries.ops_called(libraries.bnb_layer(w, "int8"), torch.randn(1, 1, 128))
    assert ("aten::_int_mm" in int8_ops) == (cond["torch >= 2.6"] and cond["torch CPU capability"] == "AVX512")


def test_a_profile_after_importing_labkit_prints_nothing_to_stderr():
    """Kineto prints a "USDT: … profiler_start/stop" pair to stderr at every torch.profiler profile: an executed
    notebook would carry it under every operator list. Importing labkit sets its log level above them."""
    import os
    import subprocess
    import sys

    code = ("import torch, labkit\n"
            "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):\n"
            "    torch.ones(3) + 1\n")
    env_vars = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_vars, check=True)
    assert "profiler_start" not in run.stderr and "USDT" not in run.stderr, run.stderr
