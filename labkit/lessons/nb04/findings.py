"""Notebook 04's takeaways: the cold start's phases, what the first request costs, the warmup loop and
torch.compile's pay-back.
"""
from __future__ import annotations

from typing import Any

from ...core import verdict
from ...core.timing import Measurement
from ...engines.warmup import GROWTH_SOURCES, ColdStart, settle_point, window_spread
from ..findings import Findings


def settle_words(latencies_s: list[float], until_spread: float, window: int) -> str:
    """What the stopping rule decided (a clause, to follow "The warmup loop: ") on ``latencies_s`` and why, with what the first call paid beside it.

    The rule (``warmup.settle_point``) discards calls until a window of ``window`` calls spreads less than
    ``until_spread`` ((p90 - p10) / median); a first call a few per cent slower than the rest can sit inside such a
    window and be kept. So "0 calls discarded" and "the first call paid X %" are two rules, both true: the words say
    which is which."""
    n = settle_point(latencies_s, until_spread, window)
    rule = f"the stopping rule: the spread of {window} calls in a row under {until_spread:.0%}"
    if n is None:
        return f"no window settled within {len(latencies_s)} calls ({rule})"
    steady = latencies_s[n:n + window]
    spread, median = window_spread(steady), Measurement.from_values("steady", steady).median
    first = latencies_s[0]
    paid = (first - median) / first  # the one-time share, against this steady window's median
    first_v = verdict.against(first, steady, higher_is_better=False)  # one call against the window's calls
    kept = (f"no call had to be discarded by {rule} (its first {window} calls spread {spread:.1%})" if n == 0 else
            f"{n} call(s) were discarded by {rule} (calls {n + 1}–{n + window} spread {spread:.1%})")
    pays = verdict.pick(
        first_v, worse=(f"; the first call still paid {paid:.1%} one-time cost (against that window's median): the rule "
                        f"kept it because a spread from p10 to p90 over {window} calls only partly sees one slow call"
                        if n == 0 else f"; the first call paid {paid:.1%} one-time cost against that window's median"),
        better=f"; the first call was {-paid:.1%} faster than that window's median ({first_v.reason})",
        same=f"; the first call was {first_v.label} against that window's calls ({paid:+.1%}: {first_v.reason})")
    return kept + pays


def takeaways(*, cold: "ColdStart", warmed: "ColdStart", steady_s: float, one_time_share: float,
              memory_growth: dict[str, int | None], weight_bytes: int, loop_warmup_calls: int | None, loop_calls: int,
              summary: Any, compile_rows: Any, loop_latencies_s: list[float] | None = None,
              until_spread: float | None = None, window: int = 5) -> Findings:
    """Takeaway sentences whose every claim is read from this run's results; words follow the numbers.

    ``memory_growth``: what the first request added, by source (``warmup.first_request_growth``: the RSS on a
    CPU, the CUDA allocator and NVML on a GPU, where the weights live).

    ``loop_latencies_s`` (with ``until_spread`` and ``window``): the notebook's warmup loop, every call, so the
    sentence can say what its stopping rule kept beside what the first call paid (``settle_words``).

    ``summary``: rows indexed by series ('cold', 'warmed') with first_s, median_s and agreement;
    ``compile_rows``: the compile table (target, where, break_even_calls, and max_abs_diff / agreement where known);
    a row with ``tokens_per_call`` (a whole model's requests) pays back in tokens, the unit notebooks 05 and 08 use.
    A row whose ``samples`` are rounds (``paired``: round i of eager and compiled side by side) is judged paired; one
    without (a reference recorded before paired rounds) by the unpaired rule, and the sentence says so with its
    ``judged`` words ("judged unpaired, recorded DATE")."""
    phases = {k: v for k, v in cold.phases().items() if v is not None and k != "second_request_s"}
    largest = max(phases, key=phases.get)
    before = sum(v for k, v in phases.items() if k != "first_request_s")
    ratio = cold.first_request_s / steady_s
    rows = [{"finding": "first request / steady, cold process", "value": ratio},
            {"finding": "one-time share of the first request", "value": one_time_share},
            {"finding": f"largest phase ({largest.removesuffix('_s')}), seconds", "value": phases[largest]}]
    measured = {src: b for src, b in memory_growth.items() if b is not None}
    rows += [{"finding": f"{src} growth of the first request / weight bytes", "value": b / weight_bytes}
             for src, b in measured.items()]
    grew = ("; ".join(f"{GROWTH_SOURCES[src]} grew by {b / 2**20:.0f} MiB, {b / weight_bytes:.2f}× the weights"
                      for src, b in measured.items()) or
            "no memory source could be read here: " + ", ".join(memory_growth))
    first_v = verdict.against(cold.first_request_s, cold.requests_s[-window:], higher_is_better=False)
    says = [f"The largest phase of this cold start was {largest.removesuffix('_s').replace('_', ' ')} "
            f"({phases[largest]:.2f} s); {before:.2f} s passed before the first request.",
            verdict.pick(first_v,
                         worse=(f"The first request took {ratio:.1f}× a steady one ({cold.first_request_s * 1e3:.0f} vs "
                                f"{steady_s * 1e3:.0f} ms): {one_time_share:.0%} of it was one-time cost (the cold "
                                f"process's first request against the median of its last {window} requests: "
                                f"{first_v.reason})."),
                         better=(f"The first request was faster than the steady ones ({cold.first_request_s * 1e3:.0f} "
                                 f"vs {steady_s * 1e3:.0f} ms: {first_v.reason}): the machine sped up during the run."),
                         same=(f"The first request was {first_v.label} against the steady ones "
                               f"({cold.first_request_s * 1e3:.0f} vs {steady_s * 1e3:.0f} ms; {first_v.reason}): no "
                               "one-time cost showed above this run's noise."))
            + f" During it {grew}."]
    if loop_latencies_s is not None and until_spread is not None:
        says.append(f"The warmup loop written here: {settle_words(loop_latencies_s, until_spread, window)}.")
    elif loop_warmup_calls is None:
        says.append(f"The warmup loop written here did not settle within {loop_calls} calls.")
    else:
        says.append(f"The warmup loop written here settled after {loop_warmup_calls} warmup call(s) "
                    f"({loop_calls} calls with the steady window).")
    c, w = summary.loc["cold"], summary.loc["warmed"]
    gain = c.first_s / w.first_s
    after = verdict.compare([w.first_s], [c.first_s], higher_is_better=False)  # one request 1 in each process
    rows.append({"finding": "request 1, cold / after warmup", "value": gain, "verdict": after.kind})
    same = "identical answers" if min(c.agreement, w.agreement) == 1 else \
        f"greedy agreement down to {min(c.agreement, w.agreement):.0%}"
    says.append(f"After a warmup, request 1 took {w.first_s * 1e3:.0f} ms against {c.first_s * 1e3:.0f} ms cold: "
                + verdict.pick(after, better="faster", worse="slower", same=after.label,
                               unsure=f"{after.label}, one request in each process")
                + f", with {same} against the cold process's first answer.")
    if warmed.warmup is not None:
        rep = warmed.warmup
        says.append(f"labkit's warmup in the second process: {settle_words(rep.latencies_s, rep.until_spread, rep.window)}.")
    for r in compile_rows.to_dict("records"):
        be, per_call = r.get("break_even_calls"), r.get("tokens_per_call")
        timed = r.get("samples") if isinstance(r.get("samples"), dict) else None
        paired = r.get("paired") in (True,)  # True or numpy's True; a row without it reads NaN in a table
        steady = (verdict.compare(timed["compiled_s"], timed["eager_s"], higher_is_better=False, paired=paired)
                  if timed and timed.get("compiled_s") and timed.get("eager_s") else None)
        judged = r.get("judged") if isinstance(r.get("judged"), str) else ""  # how a reference's rows were read
        if steady is not None and steady.kind not in (verdict.BETTER, verdict.WORSE):
            be = None  # a steady gain within noise pays back nothing this run can show
        pay = (f"no measurable steady gain ({steady.label}: {steady.reason}), so no pay-back can be read from this run"
               if steady is not None and be is None and steady.kind not in (verdict.BETTER, verdict.WORSE) else
               "never pays back (compiled calls were not faster)" if be is None or be != be else
               f"pays back after {be * per_call:,.0f} tokens" if per_call and per_call == per_call else
               f"pays back after {be:,.0f} calls")
        says.append(f"torch.compile, {r['target']} ({r['where']}{'; ' + judged if judged else ''}): first call "
                    f"{r['compiled_first_s']:.2f} s vs "
                    f"{r['eager_first_s']:.3f} s eager; {pay}.")
    return Findings(rows=rows, sentences=says)
