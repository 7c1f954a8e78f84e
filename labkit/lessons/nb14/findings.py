"""Notebook 14's takeaways: how far four benchmark clients stay apart before and after one definition, what a
reader of A/B trials calls a difference when there is none and when there is one (one run each, the
overlap rule, a request bootstrap, the paired test), what a concurrency cap does
to TTFT, what MLPerf's LoadGen says at two rates, and whether a greedy answer depends on its batch."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...core import verdict
from ...serve.clients import readers
from ..findings import Findings


def _dev(d: Mapping[str, Any]) -> str:
    m = d["max"]
    if m["client"] is None:
        return "no two clients to compare"
    return f"{abs(m['value']):.1%} ({m['client']}, {m['metric'].replace('_s', '').replace('_', ' ')})"


METRIC_NAMES = {"ttft_p50_s": "p50 TTFT", "tpot_p50_s": "p50 TPOT", "output_tokens_per_s": "tokens/s"}


def _range(fig: Mapping[str, Any] | None) -> str:
    if not fig or fig.get("range") is None:
        return "no pass-to-pass range (one pair)"
    return f"pass-to-pass range {fig['range']:.1%}"


def anchored_sentence(a: Mapping[str, Any], lead: str | None = None) -> str:
    """The largest aligned deviation from the anchor's runs either side of each client, with that client's range, and
    the anchor's own range; ``lead``: the words before the figure (default: what the figure is)."""
    m = a["max"]
    own = a["per_client"][a["anchor"]]
    ranges = "; ".join(f"{METRIC_NAMES[metric]} {_range(own.get(metric))}"
                       for metric in ("tpot_p50_s", "output_tokens_per_s"))
    if m["client"] is None:
        return f"no client had a pair with {a['anchor']}'s runs; {a['anchor']}'s own runs: {ranges}"
    row = a["per_client"][m["client"]]
    lead = f"largest aligned deviation from {a['anchor']}'s runs either side of it:" if lead is None else lead
    return (f"{lead} {m['value']:+.1%} ({m['client']}, "
            f"{METRIC_NAMES[m['metric']]}, median of {row['pairs']} pair"
            f"{'s' * (row['pairs'] != 1)}; {_range(row.get(m['metric']))}; {_told_apart(row[m['metric']], a)}); "
            f"{a['anchor']}'s own runs, one after another: {ranges}")


def _against_one(ratios: Sequence[float]) -> verdict.Verdict:
    """Per-pair ratios (each already client ÷ anchor) against 1, judged paired."""
    return verdict.compare(ratios, [1.0] * len(ratios), paired=True)


def _told_apart(fig: Mapping[str, Any], a: Mapping[str, Any]) -> str:
    """Whether a client's pairs tell its deviation from the drift between passes: its per-pair ratios against 1,
    judged paired."""
    ratios = fig.get("ratios") or []
    if not ratios:
        return "no pair to judge"
    v = _against_one(ratios)
    return verdict.pick(v, better="a real difference", worse="a real difference", same="the same",
                        unsure=f"not told apart from the drift between {a['anchor']}'s passes and the client's"
                        ) + f": {v.reason}"


def server_sentence(a: Mapping[str, Any]) -> str:
    """For the client with the largest deviation: whether vLLM's own mean TPOT (timed inside the server, from
    ``/metrics`` around each pass) moved the same way beside that client's passes, and what arose outside the
    server's timing (its front end's streaming, the transport, the client's clock)."""
    name = a["max"]["client"]
    if name is None:
        return "no client had a pair with the anchor: nothing to split"
    row = a["per_client"].get(name) or {}
    srv, beyond = row.get("server_tpot_mean_s") or {}, row.get("beyond_server")
    if not srv.get("ratios") or not beyond:
        return (f"vLLM's own TPOT was not read for {name}'s pairs (no /metrics around its passes, or they counted "
                "other requests than the pass's own): where its residual arises is not shown")
    s, b = _against_one(srv["ratios"]), _against_one(beyond["ratios"])
    return (f"On p50 TPOT, over {len(srv['ratios'])} of {name}'s pairs, vLLM's own mean TPOT (timed inside the "
            f"server) beside {name}'s passes against {a['anchor']}'s: {srv['deviation']:+.1%}, "
            + verdict.pick(s, better=f"the server itself ran slower while {name} drove it",
                           worse=f"the server itself ran faster while {name} drove it",
                           same="the server ran at one pace for both", unsure="not told apart from its drift")
            + f" ({s.reason}); what arose outside the server's timing (front end, transport, {name}'s clock): "
            f"{beyond['deviation']:+.1%}, "
            + verdict.pick(b, better="a real difference", worse="a real difference", same="nothing",
                           unsure="not told apart from nothing") + f" ({b.reason})")


def first_waves_sentence(fw: Mapping[str, Mapping[str, Any]], anchor: str) -> str:
    """Each client's first wave and later waves against the anchor's runs either side of it (``runs.first_waves``)."""
    parts = [f"{name} {r['first']:.2f}× and {r['later']:.2f}×" for name, r in fw.items()
             if r["first"] is not None and r["later"] is not None]
    if not parts:
        return f"no client had two waves in a pass between two of {anchor}'s: where its residual sits is not shown"
    return (f"Each client's first wave of a pass and its later waves, p50 TPOT over {anchor}'s either side of it "
            "(median of the pairs): " + "; ".join(parts) + ". A residual in the first wave alone starts with the pass "
            "(the client's start-up still running, or the server idle while the client started); one in every wave "
            "lasts")


def waves_sentence(w: Mapping[str, Any], client: str, concurrency: int) -> str:
    """What a pass's p50 rests on: its waves, and how far the server's pace moved between them (``runs.waves``)."""
    if w["range"] is None:
        return f"{client}'s passes had too few waves to show the server's pace moving within a pass"
    return (f"{client}'s passes ran as {w['waves']:g} waves of {concurrency} requests; the waves' median TPOT moved "
            f"{w['range']:.1%} within a pass (median of {w['passes']} passes): a pass's p50 rests on {w['waves']:g} "
            "waves, so each pair carries that noise, and more pairs average it out")


def clients_sentence(tables: Mapping[str, Any], cost: Mapping[str, float | None], shared: Mapping[str, Any] | None
                     ) -> str:
    """The clients' own reports against the same runs under one definition, and what each client costs."""
    busiest = max(((n, c) for n, c in cost.items() if c is not None), key=lambda x: x[1], default=None)
    said = (f"On one request set, the clients' own reports of p50 TPOT/ITL and tokens/s were up to "
            f"{_dev(tables['raw_deviation'])} away from the clients' median; recomputed from each client's own "
            f"per-request stamps under one definition and each held against labkit's runs either side of it, "
            + (anchored_sentence(tables["anchored"], lead="up to") if tables.get("anchored") else
               f"up to {_dev(tables['aligned_deviation'])} from the clients' median") + ".")
    if tables.get("anchored"):
        said += " " + server_sentence(tables["anchored"]) + "."
    if busiest is not None:
        said += (f" The busiest client, {busiest[0]}, kept {busiest[1]:.0%} of a core busy between its first request "
                 "and its last response (its start-up apart)")
        if shared:
            said += (f"; run on the server's own core instead, it moved the aligned p50 TPOT "
                     f"{shared['tpot_moved']:+.0%} and tokens/s {shared['tokens_per_s_moved']:+.0%}")
        said += "."
    return said


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def sizing_sentence(z: Mapping[str, Any], recorded: int) -> str:
    """What the A/A recording measured (σ_d over its pairs) and the pairs the t formula asks for the slowdown."""
    said = (f"σ_d over {recorded} recorded A/A pairs (ln of B's pass median TPOT over A's): {z['sigma_d']:.3f}. A "
            f"{z['change']:.0%} slowdown ({z['per_token_s'] * 1e3:.1f} ms a token on a median TPOT of "
            f"{z['tpot_a_s'] * 1e3:.1f} ms) needs {z['needed']} pairs for 90 % power; each A/B trial runs "
            f"{z['pairs']}")
    if not z["afforded"]:
        said += ", all this run affords"
    return said + "."


def afforded(ab: Mapping[str, Any]) -> bool:
    """Whether the A/B trials ran as many pairs as the power formula asked for."""
    return bool(ab["afforded"])


def _goal() -> str:
    return f"at most {verdict.ALPHA:.0%} false positives and at least {verdict.POWER:.0%} detection"


def _at_least(k: int, n: int, p: float) -> float:
    """The chance of k or more successes in n trials, each a success with chance p (the binomial tail)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _resampled_only(ab: Mapping[str, Any]) -> str:
    """For the readers that met the goal on the resampled trials and missed it on the few real ones: what the real
    trials counted, how often a reader exactly at the goal counts that many (the binomial tail), and whether the real
    trials can tell the two apart (every such chance at least ``verdict.ALPHA``)."""
    said = []
    for r in ab["table"]:
        if r["meets_goal"] or r.get("aa_fp_real") is None or r.get("detected_real") is None:
            continue
        if not readers.meets({"aa_false_positive_rate": r["aa_fp_resampled"],
                              "slowdown_detection_rate": r["detected_resampled"]}):
            continue
        n_aa, n_ab = ab["aa_trials"], ab["ab_trials"]
        alarms, misses = round(r["aa_fp_real"] * n_aa), round((1 - r["detected_real"]) * n_ab)
        parts, chances = [], []
        if r["aa_fp_real"] > verdict.ALPHA:  # fact: a share of trials against the test's α
            chances.append(_at_least(alarms, n_aa, verdict.ALPHA))
            parts.append(f"{alarms} false alarm{'s' * (alarms != 1)} in {n_aa} A/A, which a reader exactly at "
                         f"{verdict.ALPHA:.0%} raises that many or more in {chances[-1]:.0%} of such runs")
        if r["detected_real"] < verdict.POWER:  # fact: a share of trials against the test's power
            chances.append(_at_least(misses, n_ab, 1 - verdict.POWER))
            parts.append(f"{misses} miss{'es' * (misses != 1)} in {n_ab} A/B, which a reader exactly at "
                         f"{verdict.POWER:.0%} makes that many or more in {chances[-1]:.0%} of such runs")
        apart = min(chances) < verdict.ALPHA  # fact: a probability against α
        said.append(f"{r['reader']} met it on the resampled trials, not on the real ones ({'; '.join(parts)}): "
                    + ("the real trials say it fell short" if apart else
                       f"{n_aa + n_ab} real trials cannot tell it from a reader at the goal"))
    return "; ".join(said)


def readers_sentence(ab: Mapping[str, Any]) -> str:
    """Each reader's rates on the resampled trials (and the real ones), and which readers met the goal: only what the
    table shows."""
    parts = [f"{r['reader']} {_pct(r['aa_fp_resampled'])} false positives and {_pct(r['detected_resampled'])} "
             f"detection" for r in ab["table"]]
    met = [r["reader"] for r in ab["table"] if r["meets_goal"]]
    said = (f"On {ab['resampled_trials']} A/A and {ab['resampled_trials']} slowdown trials of {ab['pairs']} pairs "
            f"drawn from the recorded passes: " + "; ".join(parts) + ". ")
    real = ab["rates"]
    said += (f"On the real trials ({ab['aa_trials']} A/A of {ab['aa_pairs']} pairs, {ab['ab_trials']} A/B of "
             f"{ab['pairs']}): " + "; ".join(f"{k} {_pct(v['aa_false_positive_rate'])} false positives, "
                                             f"{_pct(v['slowdown_detection_rate'])} detection"
                                             for k, v in real.items()) + ". ")
    near = _resampled_only(ab)
    if met:
        said += f"Met {_goal()}: {', '.join(met)}." + (f" {near[0].upper()}{near[1:]}." if near else "")
    elif near:
        said += f"No reader met {_goal()} on both kinds of trial: {near}."
    else:
        said += (f"No reader met {_goal()}: at {ab['pairs']} pairs of {ab['requests_per_pass']}-request passes, none "
                 f"here tells a {ab['slowdown_share']:.0%} slowdown from nothing reliably.")
    if not afforded(ab):
        said += (f" The formula asked for {ab['needed']} pairs at this σ_d and the run made {ab['pairs']}: the paired "
                 "test was not sized for this slowdown here.")
    return said


def aa_sentence(ab: Mapping[str, Any]) -> str:
    """The takeaway: the four readers' rates (resampled trials) and which met the goal, as ``readers_sentence``."""
    r = ab["resampled_rates"]
    met = [row["reader"] for row in ab["table"] if row["meets_goal"]]
    said = (f"With nothing changed, {verdict.ONE_RUN_RULE} called a difference in "
            f"{_pct(r['naive']['aa_false_positive_rate'])} of {ab['resampled_trials']} resampled A/A trials, the "
            f"overlap rule in {_pct(r['overlap']['aa_false_positive_rate'])}, the request bootstrap in "
            f"{_pct(r['bootstrap']['aa_false_positive_rate'])}, the paired test in "
            f"{_pct(r['paired']['aa_false_positive_rate'])}; with {ab['slowdown_share']:.0%} added to every token they "
            f"caught it in {_pct(r['naive']['slowdown_detection_rate'])}, "
            f"{_pct(r['overlap']['slowdown_detection_rate'])}, {_pct(r['bootstrap']['slowdown_detection_rate'])} and "
            f"{_pct(r['paired']['slowdown_detection_rate'])} ({ab['pairs']} pairs a trial, σ_d {ab['sigma_d']:.3f}).")
    if met:
        said += f" Only {' and '.join(met)} met {_goal()} here." if len(met) < len(ab["table"]) else \
            f" Every reader met {_goal()} here."
    elif near := _resampled_only(ab):
        said += f" None met {_goal()} on both kinds of trial: {near}."
    else:
        said += f" None met {_goal()} at this size."
    return said


def loops_sentence(loops: Mapping[str, Any], judged: Any, judged_long: Any) -> str:
    c, o, cl = loops["closed"], loops["open"], loops["closed_long"]
    short, long_ = loops["tokens"]
    return (f"Under a cap of {loops['concurrency']} in flight, p50 TTFT was {c['ttft_p50_s']:.3f} s; Poisson "
            f"arrivals at the same mean rate ({loops['rate_per_s']:.2f}/s) gave {o['ttft_p50_s']:.3f} s "
            f"({judged.ratio:.2f}×, {judged.word('lower', 'higher')}: {judged.reason}). Under the cap, answers of "
            f"{long_} tokens instead of {short} gave p50 TTFT {cl['ttft_p50_s']:.3f} s ({judged_long.ratio:.2f}×, "
            f"{judged_long.word('lower', 'higher')}: {judged_long.reason}). Each load ran once, not repeated: a "
            "verdict here reads one run's requests, which share that run's drift, so it says less than a paired one.")


def loadgen_sentence(rows: Sequence[Mapping[str, Any]], limits: Mapping[str, float]) -> str:
    parts = [f"{r['scenario']} at {r['target_qps']:.2f} queries/s: {r.get('Result is', 'no summary')}"
             + (f" (early stopping {r.get('Early stopping satisfied', '?')}, constraints "
                f"{r.get('Performance constraints satisfied', '?')})" if r["scenario"] == "Server" else "")
             for r in rows]
    return (f"MLPerf LoadGen with TTFT ≤ {limits['ttft_s']:.2f} s and TPOT ≤ {limits['tpot_s'] * 1e3:.0f} ms "
            f"(llama3.1-8b's {limits['official_ttft_s']:g} s and {limits['official_tpot_s'] * 1e3:.0f} ms, rescaled): "
            + "; ".join(parts) + ". Not an MLPerf result: shortened and rescaled for a laptop.")


def divergence_sentence(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    parts = []
    for label, rs in rows.items():
        changed = [r for r in rs if r["first_difference"] is not None]
        worst = max((r["max_logit_diff"] for r in rs if r.get("max_logit_diff") is not None), default=None)
        logit = f", largest logit difference {worst:.3g}" if worst is not None else ""
        parts.append(f"{label}: {len(changed)} of {len(rs)} answers changed in a batch{logit}")
    return ("Same prompt, greedy, alone and inside batches: " + "; ".join(parts) + ". A change starts at a near-tie "
            "between two tokens, which another summation order tips.")


def takeaways(*, tables: Mapping[str, Any], ab: Mapping[str, Any], loops: Mapping[str, Any] | None,
              lg_rows: Sequence[Mapping[str, Any]], divergence: Mapping[str, Sequence[Mapping[str, Any]]],
              sentences: Sequence[str]) -> Findings:
    """The rows (the largest aligned deviation first) and the sentences they choose."""
    rows: list[dict[str, Any]] = [
        {"finding": "largest aligned deviation from labkit's runs either side of it (p50 TPOT, tokens/s)",
         "value": abs(tables["anchored"]["max"]["value"])} if tables.get("anchored") else
        {"finding": "largest deviation between clients after alignment (p50 TPOT, tokens/s)",
         "value": abs(tables["aligned_deviation"]["max"]["value"])},
        {"finding": "largest deviation between the clients' own reports",
         "value": abs(tables["raw_deviation"]["max"]["value"])},
    ]
    for row in ab["table"]:
        reader = row["reader"]
        rows.append({"finding": f"A/A false-positive rate ({reader}, resampled)", "value": row["aa_fp_resampled"]})
        rows.append({"finding": f"injected slowdown detected ({reader}, resampled)",
                     "value": row["detected_resampled"]})
    rows.append({"finding": "σ_d of the A/A pairs (log-ratio)", "value": ab["sigma_d"]})
    rows.append({"finding": "pairs the power formula asked for the slowdown", "value": ab["needed"]})
    if loops:
        rows.append({"finding": "p50 TTFT, open loop ÷ closed loop at the same mean rate",
                     "value": loops["open"]["ttft_p50_s"] / loops["closed"]["ttft_p50_s"]})
    for r in lg_rows:
        rows.append({"finding": f"LoadGen {r['scenario']} at {r['target_qps']:.2f} queries/s VALID",
                     "value": int(r.get("Result is") == "VALID")})
    for label, rs in divergence.items():
        rows.append({"finding": f"answers changed in a batch, {label}",
                     "value": sum(r["first_difference"] is not None for r in rs)})
    return Findings(rows, list(sentences))
