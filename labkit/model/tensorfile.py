"""A safetensors file read without loading it: the one reader of its header (an 8-byte little-endian length, then
that many bytes of JSON naming each tensor's dtype, shape and byte offsets).

``header``         the header's size in bytes (the length field and the JSON) and the JSON itself
``payload_bytes``  bytes of the tensors the file holds (the file is the header plus these)

Used by the adapters' sizes (notebook 12) and by the KV files vLLM's connector writes (``serve.vllm.disagg``).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

LENGTH_BYTES = 8  # the header's length, little-endian unsigned 64-bit


def header(path: str | Path) -> tuple[int, dict[str, Any]]:
    """A safetensors file's header: its size in bytes (the 8-byte length and the JSON) and the JSON."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such safetensors file")
    with path.open("rb") as fh:
        raw = fh.read(LENGTH_BYTES)
        if len(raw) < LENGTH_BYTES:
            raise ValueError(f"{path}: {len(raw)} bytes, shorter than a safetensors header's length field")
        (n,) = struct.unpack("<Q", raw)
        try:
            return LENGTH_BYTES + n, json.loads(fh.read(n))
        except ValueError as exc:
            raise ValueError(f"{path}: its header is not JSON ({exc}); is it a safetensors file?") from None


def payload_bytes(path: str | Path) -> int:
    """Bytes of the tensors a safetensors file holds, from its header's offsets (``__metadata__`` excluded)."""
    _n, meta = header(path)
    return sum(end - start for key, t in meta.items() if key != "__metadata__" for start, end in [t["data_offsets"]])
