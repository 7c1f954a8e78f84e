"""Checks every layer shares: a count that must be positive, and the device a model's inputs go to.

This module knows no model class and no backend: it reads attributes, so a transformers model, an optimum
ONNX Runtime model and a plain ``torch.nn.Module`` answer the same way.
"""
from __future__ import annotations

from typing import Any


def positive(name: str, value: Any) -> int:
    """``value`` when it is a positive ``int`` (not a bool); else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r}: must be a positive integer")
    return value


def model_device(model: Any) -> Any:
    """The device a model's inputs must be on: its ``device`` attribute (transformers, optimum), else the device
    of its first parameter or buffer; ``None`` for an object that holds no tensors (a plain callable)."""
    dev = getattr(model, "device", None)
    if dev is not None:
        return dev
    for kind in ("parameters", "buffers"):
        tensors = getattr(model, kind, None)
        first = next(iter(tensors()), None) if callable(tensors) else None
        if first is not None:
            return first.device
    return None
