"""Notebook 09's takeaways: the chosen configuration against the baseline under the same load and SLO.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import Findings


def takeaways(*, table: Any, before: str, after: str, limits: Mapping[str, int | None]) -> Findings:
    """``table``: ``report.before_after`` (one row per figure: key, before, after, 'after / before'); ``limits``:
    configuration → the highest client count meeting the SLO. The headline: requests/s after over before (one
    load run each: a ratio to read beside the SLO, not a verdict)."""
    by = table.set_index("key")
    tp, lat = by.loc["request_throughput"], by.loc["e2e_mean_s"]
    says = [f"{after}: {tp['after / before']:.1f}× the requests/s of the baseline, mean latency {lat['before']:.1f} s → "
            f"{lat['after']:.1f} s, SLO met up to {limits[after]} clients (baseline: {limits[before]})."]
    rows = [{"finding": f"requests/s, {after} / {before}", "value": tp["after / before"]},
            {"finding": f"highest concurrency meeting the SLO, {after}", "value": limits[after]},
            {"finding": f"highest concurrency meeting the SLO, {before}", "value": limits[before]}]
    return Findings(rows=rows, sentences=says)
