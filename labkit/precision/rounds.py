"""Decode speed of every precision variant, timed in interleaved rounds so drift hits them all alike.

``measure.run`` measures each variant alone (load, memory, quality) and releases it: the honest way to read
its memory, the wrong way to compare speeds on a laptop whose load moves from minute to minute. ``retime``
loads every variant that ran, all at once, and times ``rounds`` rounds of one decode each, each round in a shuffled
order (ort-int8 fp32 …, fp32 ort-int8 …), the baseline timed first and again after the last round (drift); it
overwrites each row's decode speed with the medians, keeps every round's figure (``samples``, round i at index i)
and the baseline's drift. ``run`` does both. Two rows' ``samples`` pair up round by round: judge them with
``verdict.compare(..., paired=True)``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..core import verdict
from ..decoding import generation
from ..model.onnx import check_providers, session_providers
from . import measure
from . import variants as _variants
from .measure import Inputs


def retime(rows: list[dict[str, Any]], inputs: Inputs, *, model_name: str | None = None, device: str | None = None,
           options: dict[str, dict[str, Any]] | None = None, prompt: str = generation.TIMED_PROMPT) -> float | None:
    """Re-time the ok rows' decode in interleaved rounds (see the module docstring); returns the baseline's drift.

    A variant that measured alone but fails to load again, or whose ONNX Runtime session ran on another provider,
    is marked "failed while measuring: …" and keeps no speed: nothing is compared with a figure it did not make.
    """
    s = inputs.settings
    # rounded weights compute in fp32: timing them would time fp32 under the format's name
    ok = [r for r in rows if r.get("status") == "ok" and not _variants.SPECS[r["variant"]].fake_format]
    if not ok:
        return None
    by_name = {r["variant"]: r for r in ok}
    loaded: dict[str, Any] = {}
    try:
        for r in ok:
            v = _variants.load_variant(r["variant"], model_name, device, **(options or {}).get(r["variant"], {}))
            if v.rss_sampler is not None:
                v.rss_sampler.stop()  # memory was read in the first pass; a sampler thread would cost CPU here
            if v.ok:
                loaded[r["variant"]] = v
            else:
                _unmeasured(r, f"failed while measuring: it loaded alone but not again ({v.status})")
        timed = generation.decode_variants({name: (v.model, v.tokenizer) for name, v in loaded.items()},
                                           new_tokens=s.new_tokens, rounds=s.repeats, prompt=prompt) if loaded else {}
        for name, v in loaded.items():
            if v.backend == "onnxruntime" and (problem := check_providers(v.options["provider"],
                                                                          session_providers(v.model))):
                timed.pop(name, None)
                _unmeasured(by_name[name], f"failed while measuring: {problem}")
    finally:
        for v in loaded.values():
            v.release()
    drift = next(iter(timed.values()))["drift"] if timed else None
    for name, t in timed.items():
        by_name[name].update(tpot_s=t["tpot_s"], decode_tokens_per_s=t["decode_tokens_per_s"],
                             decode_spread=t["spread"], decode_n=t["n"], ttft_s=t["ttft_s"], timed="interleaved rounds",
                             samples={k: t["samples"][k] for k in ("decode_tokens_per_s", "tpot_s", "ttft_s")})
    for r in ok:
        r["drift"] = drift
        r["doubts"] = "; ".join(verdict.doubts(r.get("decode_spread"), drift))  # a rough median, a moving machine
    return drift


def _unmeasured(row: dict[str, Any], status: str) -> None:
    row["status"] = status
    for key in ("tpot_s", "decode_tokens_per_s", "ttft_s"):
        row[key] = None


def run(variant_names: Sequence[str], inputs: Inputs, **kw: Any) -> tuple[list[dict[str, Any]], float | None]:
    """``measure.run`` (memory and quality, each alone) then ``retime`` (speed, interleaved): (rows, drift)."""
    once = dataclasses.replace(inputs, settings=dataclasses.replace(inputs.settings, repeats=1))  # speed: below
    rows = list(measure.run(variant_names, inputs=once, **kw))
    kw.pop("progress", None)
    return rows, retime(rows, inputs, **kw)
