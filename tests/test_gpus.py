"""labkit.model.gpus: the catalogue holds every GPU the lessons name, with datasheet figures, found by alias."""
from __future__ import annotations

import pytest

from labkit.model import gpus

REQUIRED_GPUS = ["T4", "A10G", "L4", "A100-40GB", "A100-80GB", "H100-SXM", "H200", "RTX-4090"]


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_catalog_has_gpu_with_datasheet_figures(name):
    g = gpus.gpu(name)
    assert g.memory_gb >= 16 and g.bandwidth_gbs >= 300 and g.fp16_tflops and g.fp16_tflops > 50
    assert "datasheet" in g.source.lower() or "whitepaper" in g.source.lower()


def test_gpu_lookup_by_alias_and_errors():
    assert gpus.gpu("h100").name == "H100-SXM"
    assert gpus.gpu("rtx 4090").name == "RTX-4090"
    assert gpus.gpu("T4").bf16_tflops is None  # Turing has no bf16
    with pytest.raises(ValueError, match="choose one of"):
        gpus.gpu("Voodoo2")


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_fp8_and_fp4_peaks_follow_the_architecture_with_their_provenance(name):
    """FP8 tensor cores from Ada/Hopper (compute capability 8.9) on, FP4 from Blackwell on; where listed, FP8 is
    twice the dense fp16 figure (the vendors' tables), and each figure names where it was read."""
    g = gpus.gpu(name)
    has_fp8 = name in ("L4", "H100-SXM", "H200", "RTX-4090")
    assert (g.fp8_tflops is not None) == has_fp8, (name, g.fp8_tflops)
    assert g.fp4_tflops is None  # no Blackwell in this list
    assert g.fp8_fp4_source and ("http" in g.fp8_fp4_source)
    if has_fp8:
        assert g.fp8_tflops == pytest.approx(2 * g.fp16_tflops, rel=0.01)
        assert "sparsity" in g.fp8_fp4_source or "dense" in g.fp8_fp4_source


def test_the_compute_roof_moves_with_the_format_only_where_the_tensor_cores_exist():
    h100, a100 = gpus.gpu("H100-SXM"), gpus.gpu("A100-80GB")
    assert h100.flops_for("fp8") == h100.fp8_tflops * 1e12 == pytest.approx(2 * h100.flops_for("fp16"), rel=0.01)
    assert a100.flops_for("fp8") == a100.flops_for("fp16")  # no FP8 tensor cores: weight-only, fp16's roof
    assert h100.flops_for("nvfp4") == h100.flops_for("fp16")  # Hopper has no FP4 tensor cores
    assert h100.flops_for("int8") == h100.flops_for("fp16")  # LLM.int8 and int4 dequantise to fp16


def test_blackwell_lists_fp4_at_twice_fp8_and_its_roof_uses_it():
    b200 = gpus.gpu("hgx-b200")
    assert b200.fp4_tflops == 2 * b200.fp8_tflops == 4 * b200.fp16_tflops
    assert b200.flops_for("nvfp4") == b200.flops_for("mxfp4") == b200.fp4_tflops * 1e12
    assert "halved" in b200.fp8_fp4_source and "http" in b200.source
