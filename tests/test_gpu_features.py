"""What a GPU can do has one table (``labkit.core.gpu_features``): every module that decides a GPU path asks it, and
no other module writes a compute-capability threshold."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from unittest import mock

import pytest

from labkit.core import env, gpu_features
from labkit.model import hardware
from labkit.serve.vllm import offline

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("feature", "below", "at"), [
    ("fp16", (6, 0), (7, 0)), ("bf16", (7, 5), (8, 0)), ("flash_attention_2", (7, 5), (8, 0)),
    ("fp8_marlin", (7, 5), (8, 0)), ("fp8", (8, 6), (8, 9)), ("fp4", (9, 0), (10, 0))])
def test_each_feature_starts_at_its_capability(feature, below, at):
    assert not gpu_features.has(feature, below) and gpu_features.has(feature, at)
    assert gpu_features.why_not(feature, at) == ""
    said = gpu_features.why_not(feature, below, "GPU-X")
    assert said.startswith(f"GPU-X (compute capability {below[0]}.{below[1]}) has no ")
    assert f"it needs {at[0]}.{at[1]} (" in said and said.endswith(") or newer"), said


def test_mps_has_its_own_row_with_reasons():
    assert gpu_features.has("fp16", "mps") and gpu_features.has("bf16", "mps")
    assert not gpu_features.has("fp8", "mps") and "FP8" in gpu_features.why_not("fp8", "mps")
    assert not gpu_features.has("flash_attention_2", "mps") and "CUDA" in gpu_features.why_not("flash_attention_2", "mps")
    with pytest.raises(ValueError, match="compute capability"):
        gpu_features.has("fp16", "cuda:0")
    with pytest.raises(ValueError, match="choose one of"):
        gpu_features.has("tf32", (8, 0))


def test_the_table_is_standard_library_only():
    """The set-up cell reads it before torch is installed."""
    tree = ast.parse((ROOT / "labkit/core/gpu_features.py").read_text(encoding="utf-8"))
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= {"__future__", "dataclasses"}, roots


def _cuda(major: int, minor: int, name: str = "Tesla T4"):
    cuda = mock.patch.multiple("torch.cuda", is_available=lambda: True, device_count=lambda: 1,
                               get_device_name=lambda i=0: name, get_device_capability=lambda i=0: (major, minor))
    return cuda


def test_env_hardware_and_vllm_read_the_one_table():
    """A T4 (7.5): no native bf16 in env and hardware, fp16 tensor cores yes; vLLM's FP8 refused with the wording."""
    with _cuda(7, 5):
        cap = env.bf16("cuda:0")
        assert not cap.available and cap.reason == gpu_features.why_not("bf16", (7, 5), "Tesla T4")
        f = hardware.half_precision_features("cuda:0")
        assert f["fp16_tensor_cores"] and not f["bf16_native"]
        assert gpu_features.needs("bf16") in hardware.fast_half_matmul_reason("cuda:0")
    with pytest.raises(ValueError, match=re.escape(gpu_features.needs("fp8_marlin"))):
        offline.fp8_path((7, 5))
    with _cuda(8, 0, "A100"):
        assert env.bf16("cuda:0").available and hardware.fast_half_matmul_reason("cuda:0") == ""


def test_no_other_module_writes_a_capability_threshold():
    """A tuple like (8, 9) compared with a capability, or ``major >= 8``, lives only in gpu_features."""
    pattern = re.compile(r"major\s*[<>]=?\s*\d|capability\)?\s*[<>]=?\s*\(\d+,\s*\d+\)|=\s*\(\d+,\s*\d\)\s*#.*(Ampere|"
                         r"Volta|Ada|Hopper|Blackwell)")
    hits = [f"{p.relative_to(ROOT)}:{n}" for base in ("labkit", "bench", "tools") for p in sorted((ROOT / base).rglob("*.py"))
            if p.name != "gpu_features.py"
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, hits
