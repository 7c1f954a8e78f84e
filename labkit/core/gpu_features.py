"""What a GPU can do, the one table of it: each feature's minimum compute capability, Apple's MPS row, and one
wording of why a device lacks it.

Every GPU rule in the lab asks here: the set-up cell's GPU line (``labkit.platforms``), native bf16
(``core.env``), fp16/bf16 matmul hardware (``model.hardware``), vLLM's FP8 path (``serve.vllm.offline``) and the
GPU preflight (``gpu_check``). A capability is read from the device (``torch.cuda.get_device_capability``),
never from ``torch.cuda.is_bf16_supported()``, which also answers True where bf16 is emulated (a T4, a V100).

Standard library only: the set-up cell reads this before torch is installed.

What it does not do: decide which GPU is present (``core.env``) or what a feature is worth there (the notebooks
measure that).
"""
from __future__ import annotations

from dataclasses import dataclass

MPS = "mps"  # Apple silicon's GPU through torch's Metal backend: no compute capability, its own row


@dataclass(frozen=True)
class Feature:
    """One thing a GPU can do: what it is called in a sentence, the compute capability it needs, the first
    architecture that has it, and whether Apple's MPS backend runs it (with why not)."""

    name: str
    minimum: tuple[int, int]
    architecture: str
    on_mps: bool
    mps_why_not: str = ""


FEATURES: dict[str, Feature] = {
    "fp16": Feature("fp16 tensor cores", (7, 0), "Volta", True),
    "bf16": Feature("native bf16", (8, 0), "Ampere", True),
    "flash_attention_2": Feature("FlashAttention-2", (8, 0), "Ampere", False,
                                 "flash-attn's kernels are CUDA only; on MPS torch's own attention runs"),
    "fp8_marlin": Feature("weight-only FP8 (vLLM's Marlin kernel)", (8, 0), "Ampere", False,
                          "vLLM's GPU kernels are CUDA only"),
    "fp8": Feature("FP8 tensor cores", (8, 9), "Ada", False, "Apple's GPUs have no FP8 arithmetic"),
    "fp4": Feature("FP4 tensor cores (NVFP4, MXFP4)", (10, 0), "Blackwell", False,
                   "Apple's GPUs have no FP4 arithmetic"),
}
# below this the lab's GPU paths are not worth taking: no fp16 tensor cores (Kaggle's P100 is 6.0)
LAB_MINIMUM = "fp16"


def capability_text(capability: tuple[int, int]) -> str:
    """"compute capability 8.9": how every sentence names a capability."""
    return f"compute capability {capability[0]}.{capability[1]}"


def needs(feature: str) -> str:
    """"8.0 (Ampere) or newer": what ``feature`` needs, in the one wording every module uses."""
    f = _feature(feature)
    return f"{f.minimum[0]}.{f.minimum[1]} ({f.architecture}) or newer"


def has(feature: str, device: tuple[int, int] | str) -> bool:
    """Whether ``device`` (a compute capability (major, minor), or "mps") has ``feature``."""
    f = _feature(feature)
    if isinstance(device, str):
        if device != MPS:
            raise ValueError(f"device {device!r}: give a compute capability (major, minor) or {MPS!r}")
        return f.on_mps
    return tuple(device) >= f.minimum


def why_not(feature: str, device: tuple[int, int] | str, name: str = "") -> str:
    """'' when ``device`` has ``feature``; else one sentence saying why not: "Tesla T4 (compute capability 7.5) has
    no native bf16: it needs 8.0 or newer (Ampere)". ``name`` is the device's own name, when known."""
    if has(feature, device):
        return ""
    f = _feature(feature)
    if device == MPS:
        return f"{name or 'Apple MPS'} has no {f.name}: {f.mps_why_not}"
    cc = capability_text(device)  # type: ignore[arg-type]
    return f"{f'{name} ({cc})' if name else cc} has no {f.name}: it needs {needs(feature)}"


def _feature(feature: str) -> Feature:
    if feature not in FEATURES:
        raise ValueError(f"unknown GPU feature {feature!r}; choose one of {sorted(FEATURES)}")
    return FEATURES[feature]
