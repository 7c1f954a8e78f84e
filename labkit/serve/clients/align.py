"""One definition for every client's records.

Clients name and compute their latencies differently (TPOT with or without the first token, tokens counted by the
server or by re-tokenising the text, throughput over the run's wall time or over the requests' span). Every client
here stamps each request, so each can be recomputed one way from its own stamps:

- ``ttft``: the first token's arrival minus the request's start, as the client stamped them;
- ``tpot``: (end − first token) ÷ (n − 1), n the server's count of output tokens (its ``usage``);
- ``output_tokens_per_s``: the requests' tokens over their span, from the first start to the last end.

``stamps`` turns the lab's ``RequestOutput`` records into the plain stamps ``aligned`` reads; ``tpots`` gives each
request's TPOT under the definition; ``deviation`` says how far each client's aligned figure lies from the median over
the clients.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.timing import percentile
from ..client import RequestOutput

ALIGNED = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "output_tokens_per_s")
JUDGED = ("tpot_p50_s", "output_tokens_per_s")  # the figures the clients must agree on after alignment
KEYS = ("start_s", "first_token_s", "end_s", "tokens")


def stamps(outputs: Sequence[RequestOutput]) -> list[dict[str, float]]:
    """The successful requests' stamps (seconds from any one origin): start, first token, end, output tokens."""
    return [{"start_s": o.start_s, "first_token_s": o.start_s + o.ttft_s, "end_s": o.start_s + o.e2e_s,
             "tokens": o.output_tokens} for o in outputs if o.success]


def check_records(records: Sequence[Mapping[str, float]]) -> None:
    if not records:
        raise ValueError("no records: every request failed or none was sent")
    for i, r in enumerate(records):
        missing = [k for k in KEYS if k not in r]
        if missing:
            raise ValueError(f"record {i} lacks {missing}: each record needs {list(KEYS)} (align.stamps makes them)")
        if not r["start_s"] <= r["first_token_s"] <= r["end_s"]:
            raise ValueError(f"record {i}: start ≤ first token ≤ end does not hold ({r['start_s']}, "
                             f"{r['first_token_s']}, {r['end_s']}): are the stamps from one clock?")


def tpots(records: Sequence[Mapping[str, float]]) -> list[float]:
    """Each request's TPOT under the one definition, (end − first token) ÷ (n − 1); a one-token answer has none."""
    return [(r["end_s"] - r["first_token_s"]) / (r["tokens"] - 1) for r in records if r["tokens"] > 1]


def aligned(records: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """The one definition (module docstring) over per-request stamps: p50 and p90 of TTFT and TPOT, output tokens
    per second over the requests' span, and the number of requests. TPOT leaves out requests of one token."""
    check_records(records)
    ttft = [r["first_token_s"] - r["start_s"] for r in records]
    tpot = tpots(records)
    span = max(r["end_s"] for r in records) - min(r["start_s"] for r in records)
    out: dict[str, Any] = {"requests": len(records),
                           "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
                           "tpot_p50_s": percentile(tpot, 50) if tpot else None,
                           "tpot_p90_s": percentile(tpot, 90) if tpot else None,
                           "output_tokens_per_s": sum(r["tokens"] for r in records) / span if span > 0 else None}
    return out


def deviation(by_client: Mapping[str, Mapping[str, Any]], metrics: Sequence[str] = JUDGED) -> dict[str, Any]:
    """Each client's figure ÷ the median over the clients, minus 1, per metric; ``max``: the largest absolute one,
    with its client and metric. Clients without a figure are left out."""
    per: dict[str, dict[str, float]] = {name: {} for name in by_client}
    worst = {"value": 0.0, "client": None, "metric": None}
    for m in metrics:
        values = {name: f[m] for name, f in by_client.items() if f.get(m) is not None}
        if len(values) < 2:
            continue
        mid = statistics.median(values.values())
        for name, v in values.items():
            per[name][m] = v / mid - 1
            if abs(per[name][m]) > abs(worst["value"]):
                worst = {"value": per[name][m], "client": name, "metric": m}
    return {"per_client": per, "max": worst}
