"""Checks every layer shares: a count or a quantity that must be positive, and the device a model's inputs go to.

This module knows no model class and no backend: it reads attributes, so a transformers model, the lab's
ONNX Runtime model and a plain ``torch.nn.Module`` answer the same way.
"""
from __future__ import annotations

import math
import numbers
from typing import Any


def positive(name: str, value: Any) -> int:
    """``value`` when it is a positive ``int`` (not a bool); else ``ValueError`` naming ``name``. A count: for a
    quantity that may be fractional (seconds, GB/s, a price) use ``positive_float``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r}: must be a positive integer")
    return value


def positive_float(name: str, value: Any, what: str = "") -> float:
    """``value`` as a ``float`` when it is a finite real number above 0 (an ``int`` or a numpy scalar too, never a
    bool, NaN or infinity); else ``ValueError`` naming ``name`` and, in brackets, ``what`` it should be."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value <= 0):
        raise ValueError(f"{name}={value!r}: must be a positive number" + (f" ({what})" if what else ""))
    return float(value)


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


def row_error(where: Any, i: int, row: Any, problem: str, key: str = "name") -> ValueError:
    """``ValueError`` for row ``i`` of data file ``where``, named by its ``key`` where it has one."""
    label = row.get(key) if isinstance(row, dict) else None
    return ValueError(f"{where}: row {i}{f' ({label!r})' if label else ''}: {problem}")


def load_rows(path: Any, list_key: str, check: Any, unique: str, what: str) -> list[dict[str, Any]]:
    """The rows under ``list_key`` of the JSON data file ``path``, each passed through ``check(row, i, path)``, with
    ``unique`` never repeated; a missing file, bad JSON or a wrong shape raises naming the file (``what`` says
    what it should hold)."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {what} (it ships in the repository's data/)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    rows = data.get(list_key) if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected {{\"{list_key}\": [ ... ]}} with at least one row")
    seen: set[Any] = set()
    for i, row in enumerate(rows):
        check(row, i, path)
        if row[unique] in seen:
            raise row_error(path, i, row, f"the same {unique} twice: give each row its own {unique}", unique)
        seen.add(row[unique])
    return rows
