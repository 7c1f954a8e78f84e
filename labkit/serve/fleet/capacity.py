"""Capacity against an SLO: where one server stops keeping up, and how many replicas a load needs.

An arrival-rate sweep (``loadgen.run`` with ``request_rate`` = r and an ``SLO``, open loop, Poisson) gives, for
each offered rate, the goodput: requests per second that met every SLO limit. While the server keeps up,
goodput follows the offered rate; past its capacity the queue grows, TTFT blows through the SLO and goodput
falls away. ``find_knee`` reads that point off the measurements; ``replicas_needed`` turns it into a replica
count for a load given as users × requests per minute, with the arithmetic written out.

The knee rule (robust to one noisy point): a rate *follows* when goodput ≥ ``follow`` × offered. Sorted by
offered rate, the knee is the highest rate that follows with no higher rate following after it: the last
following point. A point below the knee that did not follow (a hiccup on a shared machine) is reported as a
dip, not taken as the knee. Two cases are said plainly instead of being forced into a number: every rate
followed (the knee lies above the highest rate tried: ``knee_rps`` is that rate, a lower bound), and no rate
followed (the first rate already failed: ``knee_rps`` is None; sweep lower rates).

Each rate must be offered long enough for a queue to build (``steady_requests``: a duration's worth of arrivals,
never a short burst the server clears before any request waits past the SLO), and goodput is what the server
delivered within the SLO over the arrival window (``sweep_point``: good requests ÷ the window's length), not the
offered rate scaled by a share. A level that does not follow its offered rate marks the knee. ``sustained``
reads what one replica holds: the goodput at the knee (within the SLO, the figure replicas and prices are planned
from) and the ceiling (the fastest pace it completed requests at, at any level, SLO or not).

This module knows nothing about HTTP or models: it reads numbers (or ``loadgen`` results) and does arithmetic.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..loadgen import BenchmarkResult


def _number(name: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: must be a finite number")
    if positive and value <= 0:
        raise ValueError(f"{name}={value!r}: must be > 0")
    if value < 0:
        raise ValueError(f"{name}={value!r}: must be ≥ 0")
    return float(value)


def _points(offered_rps: Sequence[float], goodput_rps: Sequence[float], follow: float) -> list[dict[str, Any]]:
    if len(offered_rps) != len(goodput_rps):
        raise ValueError(f"{len(offered_rps)} offered rates but {len(goodput_rps)} goodputs: pass one goodput per "
                         "offered rate, in the same order")
    if not offered_rps:
        raise ValueError("no measurements: sweep at least one offered rate")
    pairs = [(_number(f"offered_rps[{i}]", o, positive=True), _number(f"goodput_rps[{i}]", g))
             for i, (o, g) in enumerate(zip(offered_rps, goodput_rps))]
    pairs.sort(key=lambda p: p[0])  # the sweep may come in any order; the rule reads it by rate
    for (a, _), (b, _) in zip(pairs, pairs[1:]):
        if a == b:
            raise ValueError(f"offered rate {a:g} req/s appears twice: average the repeats into one point "
                             "(or keep the later run) before looking for the knee")
    return [{"offered_rps": o, "goodput_rps": g, "ratio": g / o, "follows": g >= follow * o} for o, g in pairs]


def steady_requests(rate_rps: float, seconds: float, at_least: int = 8) -> int:
    """Requests to offer at ``rate_rps`` so arrivals last ``seconds`` (a queue builds only over time: a burst of a
    few requests meets any SLO a batch can clear), and never fewer than ``at_least``."""
    rate, s = _number("rate_rps", rate_rps, positive=True), _number("seconds", seconds, positive=True)
    return max(int(at_least), math.ceil(rate * s))


def sweep_point(outputs: Sequence[Any], rate_rps: float, slo: Any) -> dict[str, Any]:
    """One offered rate's figures from its requests (``client.RequestOutput``: ``start_s`` from the run's start,
    ``e2e_s``, ``success``) and the ``slo`` that judges them (``met(output)``):

    ``arrival_rps``    the pace requests arrived at, (n − 1) ÷ the first-to-last arrival (Poisson gaps make it
                       wander around the offered rate);
    ``completed_rps``  the pace answers came out at, (completed − 1) ÷ the first-to-last completion: the rate the
                       server really served, SLO or not; past the knee, its ceiling;
    ``pace``           completed_rps ÷ arrival_rps: 1 while the server keeps up, below while a queue grows (a queue
                       that grows breaks any SLO once the load lasts long enough, whatever this window saw);
    ``goodput_rps``    good requests ÷ the arrival window (n ÷ the offered rate), at most the pace the answers kept:
                       the rate delivered within the SLO while the load lasted; ``find_knee`` reads it."""
    rate = _number("rate_rps", rate_rps, positive=True)
    if not outputs:
        raise ValueError("sweep_point needs the requests of one offered rate: none were sent")
    starts = sorted(o.start_s for o in outputs)
    n = len(starts)
    done = sorted(o.start_s + o.e2e_s for o in outputs if o.success)
    span = starts[-1] - starts[0]
    arrival = (n - 1) / span if n > 1 and span > 0 else rate
    served = (len(done) - 1) / (done[-1] - done[0]) if len(done) > 1 and done[-1] > done[0] else None
    pace = min(served / arrival, 1.0) if served else 0.0
    good = sum(bool(slo.met(o)) for o in outputs)
    busy = (done[-1] - starts[0]) if done else 0.0
    return {"offered_rps": rate, "requests": n, "window_s": n / rate, "arrival_span_s": span, "arrival_rps": arrival,
            "completed": len(done), "failed": n - len(done), "good_requests": good, "slo_share": good / n,
            "completed_rps": served, "pace": pace, "goodput_rps": good / n * rate * pace,
            "output_tokens_per_s": (sum(o.output_tokens for o in outputs if o.success) / busy if busy > 0 else None)}


def sustained(points: Sequence[Mapping[str, Any]], knee: Mapping[str, Any]) -> dict[str, Any]:
    """What one replica holds, from a sweep's ``sweep_point`` rows and its ``find_knee``: ``rps`` the goodput at the
    knee (requests per second delivered within the SLO, never more than the ceiling: a replica cannot hold within
    the SLO more than it completes at all; replicas and prices are planned from it) and its
    ``output_tokens_per_s``; ``ceiling_rps`` the most requests per second completed at any level, SLO or not;
    ``saturated`` whether a level failed to follow (else the sweep never found the ceiling: both are lower bounds).
    None figures where no rate followed."""
    by = {float(p["offered_rps"]): p for p in points}
    ceiling = max((p["completed_rps"] for p in points if p.get("completed_rps")), default=None)
    if knee.get("knee_rps") is None:
        return {"rps": None, "output_tokens_per_s": None, "ceiling_rps": ceiling, "saturated": True, "at_rps": None}
    at = by[float(knee["knee_rps"])]
    rps = min(at["goodput_rps"], ceiling) if ceiling else at["goodput_rps"]  # knee reached or not
    return {"rps": rps, "output_tokens_per_s": at.get("output_tokens_per_s"), "ceiling_rps": ceiling,
            "saturated": bool(knee.get("reached")), "at_rps": at["offered_rps"]}


def held_said(held: Mapping[str, Any]) -> str:
    """``sustained``'s figures in one sentence: within the SLO at the knee, and the ceiling past it (or that the
    sweep never reached one, so both are lower bounds)."""
    ceiling = (f"it completed at most {held['ceiling_rps']:.2f} req/s at any rate, SLO or not"
               if held.get("ceiling_rps") else "no rate completed a request")
    if held.get("rps") is None:
        return f"One replica held no rate of this sweep within the SLO; {ceiling}."
    said = (f"One replica held {held['rps']:.2f} req/s within the SLO (goodput at the knee, {held['at_rps']:g} req/s "
            f"offered); {ceiling}")
    return said + ("." if held.get("saturated") else ": the sweep never saturated it, so both are lower bounds.")


def find_knee(offered_rps: Sequence[float], goodput_rps: Sequence[float], follow: float = 0.9) -> dict[str, Any]:
    """The highest offered rate at which goodput still follows it (see the module docstring for the rule).

    Returns ``knee_rps`` (None when the first rate already failed), ``index`` (into ``points``, sorted by
    offered rate), ``reached`` (True when a higher rate stopped following, so the knee was measured rather
    than bounded), ``reason`` (one sentence), ``dips`` (rates below the knee that did not follow) and
    ``points`` (offered, goodput, their ratio and whether it follows, by rising offered rate).
    """
    follow = _number("follow", follow, positive=True)
    if follow > 1:
        raise ValueError(f"follow={follow!r}: a fraction of the offered rate, in (0, 1] (0.9 = goodput within 10 %)")
    points = _points(offered_rps, goodput_rps, follow)
    following = [i for i, p in enumerate(points) if p["follows"]]
    pct = f"{follow:.0%}"
    if not following:
        first = points[0]
        return {"knee_rps": None, "index": None, "reached": True, "follow": follow, "dips": [], "points": points,
                "reason": (f"no knee in this sweep: already at the lowest rate, {first['offered_rps']:g} req/s, "
                           f"goodput was {first['goodput_rps']:g} req/s, under {pct} of it; sweep lower rates (or "
                           "relax the SLO)")}
    k = following[-1]
    knee = points[k]
    dips = [p["offered_rps"] for p in points[:k] if not p["follows"]]
    dip_note = (f" ({', '.join(f'{d:g}' for d in dips)} req/s dipped below {pct} but a higher rate held, so "
                "counted as noise)") if dips else ""
    if k == len(points) - 1:
        return {"knee_rps": knee["offered_rps"], "index": k, "reached": False, "follow": follow, "dips": dips,
                "points": points,
                "reason": (f"no knee reached: goodput followed the offered rate up to the highest rate tried, "
                           f"{knee['offered_rps']:g} req/s, so the knee is above it (this is a lower bound; sweep "
                           f"higher rates to find it){dip_note}")}
    nxt = points[k + 1]
    return {"knee_rps": knee["offered_rps"], "index": k, "reached": True, "follow": follow, "dips": dips,
            "points": points,
            "reason": (f"knee at {knee['offered_rps']:g} req/s: goodput {knee['goodput_rps']:g} req/s still follows "
                       f"it; from {nxt['offered_rps']:g} req/s up no rate does (goodput {nxt['goodput_rps']:g} "
                       f"req/s, {nxt['ratio']:.0%} of offered){dip_note}")}


def knee_from_summaries(runs: Sequence[BenchmarkResult | Mapping[str, Any]], follow: float = 0.9) -> dict[str, Any]:
    """``find_knee`` on a sweep of ``loadgen`` runs (``BenchmarkResult`` or its ``summary()``), each run at one
    ``request_rate`` with an ``SLO`` (which is what gives a summary its ``goodput``)."""
    offered, goodput = [], []
    for i, run in enumerate(runs):
        s = run.summary() if isinstance(run, BenchmarkResult) else run
        rate = s.get("request_rate")
        if rate is None or (isinstance(rate, float) and math.isinf(rate)):
            raise ValueError(f"run {i}: request_rate={rate!r}; a capacity sweep needs a finite rate per run "
                             "(loadgen.run(..., request_rate=r))")
        if s.get("goodput") is None:
            raise ValueError(f"run {i} (request_rate={rate:g}): no goodput in its summary; run it with an SLO "
                             "(loadgen.run(..., slo=loadgen.SLO(ttft_s=..., tpot_s=...)))")
        offered.append(rate)
        goodput.append(s["goodput"])
    return find_knee(offered, goodput, follow)


def _num(x: float) -> str:
    """A number as the arithmetic line prints it, without float noise (1.2, not 1.2000000000000002)."""
    return f"{x:.4g}"


def _rate(x: float) -> str:
    """A rate in req/s: like ``_num`` but always with a decimal point (4.0 req/s, as a rate reads)."""
    text = _num(x)
    return text if any(c in text for c in ".e") else f"{text}.0"


def replicas_needed(users: int, requests_per_min_per_user: float, knee_rps: float,
                    headroom: float = 0.8) -> dict[str, Any]:
    """Replicas that serve ``users`` each sending ``requests_per_min_per_user`` within the SLO.

    One replica is loaded to ``headroom`` × its knee (the knee is where it just keeps up; running at it leaves
    no room for bursts, which Poisson arrivals have). ``arithmetic`` writes the calculation out.
    """
    if isinstance(users, bool) or not isinstance(users, int) or users <= 0:
        raise ValueError(f"users={users!r}: a positive whole number of users")
    rpm = _number("requests_per_min_per_user", requests_per_min_per_user)
    if rpm <= 0:
        raise ValueError(f"requests_per_min_per_user={requests_per_min_per_user!r}: must be > 0 (requests one user "
                         "sends per minute)")
    if knee_rps is None:
        raise ValueError("knee_rps=None: find_knee found no knee (the first rate already failed); sweep lower rates "
                         "and pass the knee it finds")
    knee = _number("knee_rps", knee_rps)
    if knee <= 0:
        raise ValueError(f"knee_rps={knee_rps!r}: must be > 0, the request rate one replica holds at the SLO "
                         "(find_knee(...)['knee_rps'])")
    room = _number("headroom", headroom)
    if not 0 < room <= 1:
        raise ValueError(f"headroom={headroom!r}: the fraction of the knee to load a replica to, in (0, 1]")
    demand = users * rpm / 60
    per_replica = room * knee
    exact = demand / per_replica
    replicas = max(1, math.ceil(exact - 1e-9))  # 4.0 / 0.8 = 5.000000000000001 is 5 replicas, not 6
    arithmetic = (f"{users} users × {_num(rpm)} req/min = {_rate(demand)} req/s; one replica holds "
                  f"{_num(room)} × {_rate(knee)} = {_rate(per_replica)} req/s at the SLO; "
                  f"⌈{_rate(demand)} / {_rate(per_replica)}⌉ = {replicas} replica{'s' if replicas != 1 else ''}")
    return {"users": users, "requests_per_min_per_user": rpm, "demand_rps": demand, "knee_rps": knee,
            "headroom": room, "per_replica_rps": per_replica, "replicas": replicas, "arithmetic": arithmetic}
