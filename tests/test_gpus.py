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
