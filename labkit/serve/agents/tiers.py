"""Where a session's KV should live between its turns: the arithmetic of reloading against recomputing, and of how
many sessions one KV budget holds.

Recomputing a prefix of n tokens costs its prefill, n / prefill tokens/s. Reloading it from a slower tier (disk,
host memory) costs a fixed start (opening the file, allocating) plus its bytes, n × bytes per token, over that
tier's bandwidth. Reloading wins past the ``crossover``: n > start ÷ (1 / prefill tokens/s − bytes per token ÷
bandwidth), and never when the tier reads a token's KV more slowly than the model computes it. The bytes per token
come from ``labkit size``'s KV formula (``model.sizing``), the speeds from this machine's measurements.

``resident_sessions`` is the other side: how many sessions of a given length stay whole in a KV budget; the rest
are evicted, and their next turn pays a reload or a recompute.

What it does not do: measure (the notebook times reload and recompute at several lengths, interleaved) or model
attention's quadratic term (at the lab's lengths prefill is close to linear; the measurement says how close).
"""
from __future__ import annotations

import math
from typing import Any


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: a positive number")
    return float(value)


def reload_s(tokens: int, bytes_per_token: float, bandwidth_bytes_s: float, start_s: float = 0.0) -> float:
    """Seconds to read ``tokens`` positions of KV back from a tier: its fixed start plus the bytes over its bandwidth."""
    if start_s < 0:
        raise ValueError(f"start_s={start_s!r}: seconds, 0 or more")
    return start_s + tokens * _positive("bytes_per_token", bytes_per_token) / _positive("bandwidth_bytes_s",
                                                                                         bandwidth_bytes_s)


def recompute_s(tokens: int, prefill_tokens_per_s: float) -> float:
    """Seconds to prefill ``tokens`` positions again."""
    return tokens / _positive("prefill_tokens_per_s", prefill_tokens_per_s)


def crossover(bytes_per_token: float, bandwidth_bytes_s: float, prefill_tokens_per_s: float,
              start_s: float = 0.0) -> dict[str, Any]:
    """The prefix length past which reloading beats recomputing: ``{"tokens": n or None, "reason": …}`` (None when
    the tier never wins: it moves a token's KV more slowly than the model computes one)."""
    per_token_reload = _positive("bytes_per_token", bytes_per_token) / _positive("bandwidth_bytes_s", bandwidth_bytes_s)
    per_token_compute = 1 / _positive("prefill_tokens_per_s", prefill_tokens_per_s)
    if start_s < 0:
        raise ValueError(f"start_s={start_s!r}: seconds, 0 or more")
    if per_token_reload >= per_token_compute:
        return {"tokens": None, "reason": (f"reading a token's KV takes {per_token_reload * 1e6:.1f} µs and computing "
                                           f"it {per_token_compute * 1e6:.1f} µs: recomputing always wins")}
    n = math.floor(start_s / (per_token_compute - per_token_reload)) + 1
    return {"tokens": n, "reason": (f"{start_s * 1e3:.2f} ms to start a reload, then {per_token_reload * 1e6:.1f} µs "
                                    f"a token against {per_token_compute * 1e6:.1f} µs to compute one: reloading wins "
                                    f"from {n} tokens")}


def resident_sessions(budget_bytes: float, bytes_per_token: float, tokens_per_session: int) -> int:
    """Sessions of ``tokens_per_session`` positions whose KV fits whole in ``budget_bytes``."""
    per = _positive("bytes_per_token", bytes_per_token) * _positive("tokens_per_session", tokens_per_session)
    return int(_positive("budget_bytes", budget_bytes) // per)


def spill(positions: int, crossover_tokens: int | None) -> bool:
    """The disk tier's policy: write an evicted entry of ``positions`` only when reading it back will beat recomputing
    it (from the ``crossover`` length on; never when there is none)."""
    return crossover_tokens is not None and positions >= crossover_tokens
