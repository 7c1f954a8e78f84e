import pytest

from labkit import env, hardware

REQUIRED_GPUS = ["T4", "A10G", "L4", "A100-40GB", "A100-80GB", "H100-SXM", "H200", "RTX-4090"]


def test_versions_read_without_import():
    v = env.versions()
    assert v["torch"] and v["transformers"] and v["python"]
    assert "vllm" in v  # present as a key even when not installed (None)


def test_capabilities_have_reasons_when_missing():
    caps = env.capabilities()
    names = {c.name for c in caps}
    assert {"cuda", "bitsandbytes", "onnxruntime", "vllm", "tensorrt", "torch.compile"} <= names
    for c in caps:
        assert c.available or c.reason, f"{c.name} unavailable without a reason"
        assert not (c.available and c.reason), f"{c.name} available but carries a reason"


def test_capability_lookup():
    assert env.capability("cuda").name == "cuda"
    with pytest.raises(ValueError, match="choose one of"):
        env.capability("warp-drive")


def test_device_override(monkeypatch):
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    assert env.device() == "cpu"
    monkeypatch.setenv("LABKIT_DEVICE", "tpu")
    with pytest.raises(ValueError, match="LABKIT_DEVICE"):
        env.device()


def test_environment_has_provenance_fields():
    e = env.environment()
    for key in ("date", "hardware", "versions", "device", "quick", "command", "model"):
        assert key in e


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_catalog_has_gpu_with_datasheet_figures(name):
    g = hardware.gpu(name)
    assert g.memory_gb >= 16 and g.bandwidth_gbs >= 300 and g.fp16_tflops and g.fp16_tflops > 50
    assert "datasheet" in g.source.lower() or "whitepaper" in g.source.lower()


def test_gpu_lookup_by_alias_and_errors():
    assert hardware.gpu("h100").name == "H100-SXM"
    assert hardware.gpu("rtx 4090").name == "RTX-4090"
    assert hardware.gpu("T4").bf16_tflops is None  # Turing has no bf16
    with pytest.raises(ValueError, match="choose one of"):
        hardware.gpu("Voodoo2")


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


def test_matmul_cost_and_intensity():
    flops, moved = hardware.matmul_cost(1, 49152, 576, 4)
    assert flops == 2 * 49152 * 576 and moved == (49152 * 576 + 576 + 49152) * 4
    assert hardware.matmul_intensity(1, 4096, 4096, 2) < 1 < hardware.matmul_intensity(512, 4096, 4096, 2)
    with pytest.raises(ValueError, match="tokens"):
        hardware.matmul_cost(0, 8, 8, 4)
    with pytest.raises(ValueError, match="bytes_per_value"):
        hardware.matmul_cost(1, 8, 8, 0)


def test_linear_traffic_counts_every_linear_and_the_head_rows():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 4, bias=False))
    flops, moved = hardware.linear_traffic(model, 3)
    assert flops == 2 * 3 * (8 * 16 + 16 * 4)
    assert moved == 4 * (8 * 16 + 3 * 8 + 3 * 16) + 4 * (16 * 4 + 3 * 16 + 3 * 4)


def test_roofline_roofs_and_ridge():
    assert hardware.ridge_intensity(10, 100) == 10
    assert hardware.roof_gflops(0.5, 10, 100) == 5  # under the ridge: the bandwidth slope
    assert hardware.roof_gflops(50, 10, 100) == 100  # above it: the compute flat
    with pytest.raises(ValueError):
        hardware.roof_gflops(0, 10, 100)
    with pytest.raises(ValueError):
        hardware.ridge_intensity(0, 100)
