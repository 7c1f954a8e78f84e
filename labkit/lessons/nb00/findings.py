"""Notebook 00's takeaways: the default model's weights against the sizing prediction, and its first two chats on
this machine (the first pays one-time costs).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Findings


def takeaways(*, model: str, device: str, load_s: float, param_bytes: int, predicted_bytes: int,
              first: Mapping[str, Any], second: Mapping[str, Any], same_answer: bool) -> Findings:
    """``first``/``second``: the two chat calls' rows (ttft_s, tpot_s, decode_tokens_per_s, n_out). The headline:
    the second call's decode tokens/s, this machine's first speed figure."""
    ttft_x = first["ttft_s"] / second["ttft_s"]
    says = [f"{model} loaded on {device} in {load_s:.1f} s: {param_bytes / 2**20:.0f} MiB of weights, "
            f"{param_bytes / predicted_bytes:.3f}× what the sizing formula predicted from the config.",
            f"The second chat decoded at {second['decode_tokens_per_s']:.1f} tokens/s ({second['tpot_s'] * 1e3:.0f} ms per "
            f"token) on this machine; its first token came after {second['ttft_s'] * 1e3:.0f} ms, the first call's "
            f"after {first['ttft_s'] * 1e3:.0f} ms ({ttft_x:.1f}×: one call each, notebook 04 times the one-time costs "
            "with repeats). " + ("Both calls gave the same answer." if same_answer else
                                 "The two calls gave different answers: greedy decoding should not; look for the cause.")]
    rows = [{"finding": f"decode tokens/s, second chat ({device})", "value": second["decode_tokens_per_s"]},
            {"finding": "weights measured / predicted", "value": param_bytes / predicted_bytes},
            {"finding": "TTFT first call / second call (one call each)", "value": ttft_x}]
    return Findings(rows=rows, sentences=says)
