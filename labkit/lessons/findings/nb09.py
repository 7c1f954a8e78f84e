"""Notebook 09's takeaways: the chosen configuration against the baseline under the same load and SLO, and
continuous against dynamic batching judged by the verdict rules, with what quick mode's short answers hide.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...core import verdict
from . import Findings


def takeaways(*, table: Any, before: str, after: str, limits: Mapping[str, int | None],
              configs: Sequence[Mapping[str, Any]] = (), quick: bool = False, max_tokens: int | None = None) -> Findings:
    """``table``: ``report.before_after`` (one row per figure: key, before, after, 'after / before'); ``limits``:
    configuration → the highest client count meeting the SLO; ``configs``: the same-load rows (config,
    request_throughput, ``samples`` of per-request e2e_s); ``quick``/``max_tokens``: the run's mode and answer
    limit. The headline: requests/s after over before (one load run each: a ratio to read beside the SLO)."""
    by = table.set_index("key")
    tp, lat = by.loc["request_throughput"], by.loc["e2e_mean_s"]
    says = [f"{after}: {tp['after / before']:.1f}× the requests/s of the baseline, mean latency {lat['before']:.1f} s → "
            f"{lat['after']:.1f} s, SLO met up to {limits[after]} clients (baseline: {limits[before]})."]
    rows = [{"finding": f"requests/s, {after} / {before}", "value": tp["after / before"]},
            {"finding": f"highest concurrency meeting the SLO, {after}", "value": limits[after]},
            {"finding": f"highest concurrency meeting the SLO, {before}", "value": limits[before]}]
    kind = {c["config"].split(" batching")[0]: c for c in configs if " batching" in c["config"]}
    if {"dynamic", "continuous"} <= set(kind):
        dyn, con = kind["dynamic"], kind["continuous"]
        v = verdict.compare(verdict.samples(con, "e2e_s") if "samples" in con else con["e2e_mean_s"],
                            verdict.samples(dyn, "e2e_s") if "samples" in dyn else dyn["e2e_mean_s"],
                            higher_is_better=False)
        x = con["request_throughput"] / dyn["request_throughput"]
        says.append(f"Continuous against dynamic batching at the same load: {x:.2f}× the requests/s (one run each); per "
                    f"request, its latencies were {v.word('shorter', 'longer')} ({v.reason}).")
        rows.append({"finding": "requests/s, continuous / dynamic batching", "value": x, "verdict": v.kind})
        if quick:
            says.append(f"Quick mode caps every answer at {max_tokens} tokens, so answers end together and none leaves "
                        "a batch early: continuous batching has no finished row to replace here. Full mode's longer "
                        "answers end at different lengths; that is where its advantage can show.")
    return Findings(rows=rows, sentences=says)
