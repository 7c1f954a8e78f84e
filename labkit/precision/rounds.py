"""Decode speed of every precision variant, timed in interleaved rounds so drift hits them all alike.

``variants.run`` measures each variant alone (load, memory, quality) and releases it: the honest way to read
its memory, the wrong way to compare speeds on a laptop whose load moves from minute to minute. ``retime``
loads every variant that ran, all at once, and times ``rounds`` rounds of one decode each (fp32 ort-int8 …
fp32 ort-int8 …), the baseline once more at the end; it overwrites each row's decode speed with the medians,
keeps every sample (``samples``) and the baseline's drift. ``run`` does both.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from ..core import timing
from ..decoding import generation
from . import variants as _variants
from .variants import Inputs, check_providers, session_providers

PROMPT = "Write a short story about a lighthouse keeper."


def retime(rows: list[dict[str, Any]], inputs: Inputs, *, model_name: str | None = None, device: str | None = None,
           options: dict[str, dict[str, Any]] | None = None, prompt: str = PROMPT) -> float | None:
    """Re-time the ok rows' decode in interleaved rounds (see the module docstring); returns the baseline's drift."""
    s = inputs.settings
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return None
    loaded: dict[str, Any] = {}
    try:
        for r in ok:
            v = _variants.load_variant(r["variant"], model_name, device, **(options or {}).get(r["variant"], {}))
            if v.rss_sampler is not None:
                v.rss_sampler.stop()  # memory was read in the first pass; a sampler thread would cost CPU here
            if v.ok:
                loaded[r["variant"]] = v
        runs: dict[str, list[Any]] = {name: [] for name in loaded}

        def one(name: str, new_tokens: int) -> Any:
            v = loaded[name]
            return generation.generate(v.model, v.tokenizer, [prompt], max_new_tokens=new_tokens, fixed_length=True)

        for name in loaded:
            one(name, min(8, s.new_tokens))  # warmup
        order = [name for _ in range(s.repeats) for name in loaded] + list(loaded)[:1]
        for name in order:
            runs[name].append(one(name, s.new_tokens))
        for name, v in loaded.items():
            if v.backend == "onnxruntime" and (problem := check_providers(v.options["provider"],
                                                                          session_providers(v.model))):
                runs[name] = []
                next(r for r in ok if r["variant"] == name)["status"] = f"failed while measuring: {problem}"
    finally:
        for v in loaded.values():
            v.release()
    baseline = next(iter(runs), None)
    drift = None
    for r in ok:
        tpots = [x.tpot_s for x in runs.get(r["variant"], []) if x.tpot_s is not None]
        if not tpots:
            continue
        m = timing.Measurement.from_values(f"{r['variant']} tpot", tpots)
        m.warn_if_noisy()
        r.update(tpot_s=m.median, decode_tokens_per_s=1 / m.median, decode_spread=m.spread, decode_n=m.n,
                 ttft_s=statistics.median(x.ttft_s for x in runs[r["variant"]]), timed="interleaved rounds",
                 samples={"decode_tokens_per_s": [1 / t for t in tpots], "tpot_s": tpots,
                          "ttft_s": [x.ttft_s for x in runs[r["variant"]]]})
        if r["variant"] == baseline and len(tpots) > 1:
            drift = tpots[-1] / tpots[0]
    for r in ok:
        r["drift"] = drift
    return drift


def run(variant_names: Sequence[str], inputs: Inputs, **kw: Any) -> tuple[list[dict[str, Any]], float | None]:
    """``variants.run`` (memory and quality, each alone) then ``retime`` (speed, interleaved): (rows, drift)."""
    once = dataclasses.replace(inputs, settings=dataclasses.replace(inputs.settings, repeats=1))  # speed: below
    rows = list(_variants.run(variant_names, inputs=once, **kw))
    kw.pop("progress", None)
    return rows, retime(rows, inputs, **kw)
