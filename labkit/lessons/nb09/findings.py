"""Notebook 09's takeaways: the chosen configuration against the baseline under the same load and SLO, and
continuous against dynamic batching judged by the verdict rules, with what quick mode's short answers hide.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...core import verdict
from ..findings import Findings, beyond_sweep, sweep_end


def takeaways(*, table: Any, before: str, after: str, limits: Mapping[str, int | None],
              configs: Sequence[Mapping[str, Any]] = (), quick: bool = False, max_tokens: int | None = None,
              levels: Sequence[int] = (), precision: Sequence[Mapping[str, Any]] = (),
              half_reason: str | None = None, native: Mapping[str, bool] | None = None,
              sweep: Sequence[Mapping[str, Any]] = ()) -> Findings:
    """``table``: ``report.before_after`` (one row per figure: key, before, after, 'after / before'); ``limits``:
    configuration → the highest client count meeting the SLO; ``configs``: the same-load rows (config,
    request_throughput, ``samples`` of per-request e2e_s); ``quick``/``max_tokens``: the run's mode and answer
    limit; ``levels``: the sweep's concurrency levels (``SWEEP``), so a capacity at its ends is said to be a bound;
    ``precision``/``half_reason``/``native``: see ``precision_sentence`` (judged paired on its rounds); ``sweep``: the SLO sweep's rows, checked
    against the same-load rows by ``sweep_disagrees``.
    The headline: requests/s after over before (one load run each: a ratio to read beside the SLO)."""
    by = table.set_index("key")
    tp, lat = by.loc["request_throughput"], by.loc["e2e_mean_s"]
    ends = {n: sweep_end(limits[n], levels) if levels else None for n in (after, before)}
    shown = {n: {"above": f"≥ {limits[n]}", "below": f"< {min(levels)}" if levels else "none"}.get(ends[n], limits[n])
             for n in (after, before)}
    says = [f"{after}: {tp['after / before']:.1f}× the requests/s of the baseline, mean latency {lat['before']:.1f} s → "
            f"{lat['after']:.1f} s, SLO met up to {shown[after]} clients (baseline: {shown[before]})."]
    says += sweep_disagrees(configs, sweep)
    for end in dict.fromkeys(e for e in ends.values() if e):  # once per kind of end, naming who hit it
        who = " and ".join(n for n in (after, before) if ends[n] == end)
        says.append(f"For {who}, {beyond_sweep(end, levels, 'clients', 'SWEEP')}.")
    rows = [{"finding": f"requests/s, {after} / {before}", "value": tp["after / before"]},
            {"finding": f"highest concurrency meeting the SLO, {after}", "value": limits[after],
             **({"bound": ends[after]} if ends[after] else {})},
            {"finding": f"highest concurrency meeting the SLO, {before}", "value": limits[before],
             **({"bound": ends[before]} if ends[before] else {})}]
    kind = _by_kind(configs)
    if {"dynamic", "continuous"} <= set(kind):
        dyn, con = kind["dynamic"], kind["continuous"]
        v = continuous_vs_dynamic(dyn, con)
        x = con["request_throughput"] / dyn["request_throughput"]
        says.append(f"Continuous against dynamic batching at the same load: {x:.2f}× the requests/s (one run each); per "
                    f"request, its latencies were {v.word('shorter', 'longer')} ({v.reason}).")
        rows.append({"finding": "requests/s, continuous / dynamic batching", "value": x, "verdict": v.kind})
        if quick:
            says.append(f"Quick mode caps every answer at {max_tokens} tokens, so answers end together and none leaves "
                        "a batch early: continuous batching has no finished row to replace here. Full mode's longer "
                        "answers end at different lengths; that is where its advantage can show.")
    said = precision_sentence(precision, half_reason, native)
    return Findings(rows=rows, sentences=says + ([said] if said else []))


def precision_sentence(probe: Sequence[Mapping[str, Any]], half_reason: str | None,
                       native: Mapping[str, bool] | None = None) -> str:
    """Each half precision's batched decode speed over fp32's, and why it moved that way on this hardware.

    ``probe``: ``nb09.runs.choose_precision``'s rows (precision, batch, tokens_per_s with its samples); ``half_reason``:
    ``hardware.fast_half_matmul_reason()`` ('' where the device has native fp16/bf16 arithmetic); ``native``:
    ``hardware.native_half()``, per format (None: every format follows ``half_reason``). Without native arithmetic
    each half-precision matmul converts to fp32 as it goes: at batch 1 (notebook 02) a decode step is memory-bound
    and half the bytes can win; with a batch of rows PyTorch's matrix-matrix path runs, which notebook 02's
    prefill-like matmul shows several times slower in half precision there. '' when fp32 or every half precision
    is missing."""
    by = {r["precision"]: r for r in probe}
    if "fp32" not in by or not by["fp32"].get("tokens_per_s"):
        return ""
    batch, rounds = by["fp32"]["batch"], by["fp32"].get("rounds", 1)
    judged = {p: verdict.compare(verdict.samples(r, "tokens_per_s"), verdict.samples(by["fp32"], "tokens_per_s"),
                                 paired=True)  # round i of each precision at index i: the pairs
              for p, r in by.items() if p != "fp32" and r.get("tokens_per_s")}
    if not judged:
        return ""
    said = (f"At batch {batch}, " + ", ".join(f"{p} made " + verdict.phrase(v, "fp32's tokens/s") for p, v in judged.items())
            + f" (prefill included, {rounds} round{'s' * (rounds != 1)}, each in a shuffled order, judged paired).")
    slow = [p for p, v in judged.items() if v.kind == verdict.WORSE]
    unsure = [p for p, v in judged.items() if not v.real and v.kind not in (verdict.NOISE, verdict.TIED)]
    if not slow:
        return said + (f" Whether {' and '.join(unsure)} cost this batch its speed cannot be read from it: rerun with "
                       "more rounds." if unsure else " No half precision was slower than fp32 at this batch here.")
    emulated = [p for p in slow if (not native.get(p, False) if native is not None else bool(half_reason))]
    if emulated:
        which = " and ".join(emulated)
        why = half_reason or f"this device has no native {' or '.join(emulated)} arithmetic"
        said += (f" {which} lost to fp32 although {'they read' if len(emulated) > 1 else 'it reads'} half the bytes: "
                 f"{why}. At batch 1 (notebook 02) a decode step is a matrix-vector product that waits on memory, so "
                 f"half the bytes can win; with {batch} rows PyTorch takes its matrix-matrix path, where {which} without "
                 "native arithmetic runs several times fp32's time (notebook 02's prefill-like matmul): that kernel, not "
                 "the bytes, sets the speed.")
    rest = [p for p in slow if p not in emulated]
    if rest:
        said += (f" {' and '.join(rest)} lost to fp32 on hardware that computes {'them' if len(rest) > 1 else 'it'} "
                 "natively: rerun before reading it as the hardware's answer.")
    return said


def continuous_vs_dynamic(dyn: Mapping[str, Any], con: Mapping[str, Any]) -> verdict.Verdict:
    """Continuous batching's per-request latencies against dynamic batching's at the same load (lower is better)."""
    return verdict.compare(verdict.samples(con, "e2e_s") if "samples" in con else con["e2e_mean_s"],
                           verdict.samples(dyn, "e2e_s") if "samples" in dyn else dyn["e2e_mean_s"],
                           higher_is_better=False)


def lab_winner(configs: Sequence[Mapping[str, Any]], best: str) -> tuple[str | None, str]:
    """The reveal's answer to "which lab server served the most requests/s": ``best`` ('one at a time', 'dynamic'
    or 'continuous'), unless it is one of dynamic and continuous and the takeaway's verdict between them is not real:
    then (None, why), so the reveal crowns no one the takeaway calls noise."""
    kind = _by_kind(configs)
    if best in ("dynamic", "continuous") and {"dynamic", "continuous"} <= set(kind):
        v = continuous_vs_dynamic(kind["dynamic"], kind["continuous"])
        if v.kind not in (verdict.BETTER, verdict.WORSE):
            return None, f"dynamic and continuous batching per request: {v.label} ({v.reason}; one run each)"
    return best, ""


def sweep_disagrees(configs: Sequence[Mapping[str, Any]], sweep: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where the same server at the same client count met the SLO for a different share of its requests in the
    same-load run than in the SLO sweep (half the requests or more apart): the machine's speed moved between the two,
    so the SLO limit read from the sweep is this run's, not the server's. One sentence per such server."""
    out = []
    for c in configs:
        s = next((r for r in sweep if r.get("config") == c.get("config") and r.get("concurrency") == c.get("concurrency")),
                 None)
        if not s or not c.get("completed") or not s.get("completed"):
            continue
        a, b = c["good_requests"] / c["completed"], s["good_requests"] / s["completed"]
        if abs(a - b) >= 0.5:  # fact: shares of counted requests, half of them or more apart
            out.append(f"{c['config']} at {c['concurrency']} clients: {c['good_requests']} of {c['completed']} requests met "
                       f"the SLO in the same-load run, {s['good_requests']} of {s['completed']} in the sweep (TPOT p50 "
                       f"{c['tpot_p50_s']:.2f} vs {s['tpot_p50_s']:.2f} s). The same server at the same load: the "
                       "machine's speed moved between the two, so rerun before reading its SLO limit.")
    return out


def _by_kind(configs: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The same-load rows of the batching servers by kind: 'dynamic batching 8, fp32' → 'dynamic'."""
    return {c["config"].split(" batching")[0]: c for c in configs if " batching" in c["config"]}
