"""Checks for notebook 11 (scale out): the cache-aware routing decision, and the knee of a capacity sweep."""
from __future__ import annotations

from typing import Any

from ..exercises import Wrong, call, exercise


def _index(got: Any, n: int, what: str) -> int:
    if isinstance(got, bool) or not isinstance(got, int):
        raise Wrong(f"{what}: return a replica's index (an int), got {type(got).__name__}")
    if not 0 <= got < n:
        raise Wrong(f"{what}: index {got} is out of range: there are {n} replicas (0 to {n - 1})")
    return got


@exercise("11.route", "cache-aware routing decision", hints=(
    "Score each replica by the longest prefix it shares with the prompt: compare position by position from the "
    "start, against every prompt it holds, and keep its best. The request goes to the best-scoring replica. "
    "Ties, including a prompt no replica holds any of, go to the less loaded replica, then the lower index.",
    "The load can overrule the match. Find the least-loaded replica (ties: the lower index) and compare "
    "loads[choice] - loads[least] with threshold: more than threshold beyond it, and the request goes to the "
    "least-loaded replica instead. The load of the best match alone, compared with threshold, is not the rule.",
    "With `best[r]` the longest prefix replica r shares, `choice` is the replica with `best[r] == max(best)` "
    "and the smallest `(loads[r], r)`, and `least` the replica with the smallest `(loads[r], r)` of all. The "
    "answer is `least if loads[choice] - loads[least] > threshold else choice`.",
))
def _route(fn: Any) -> None:
    a, b, c = [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9], [7, 7, 7]
    cases = [  # (prompt, what each replica holds, loads, threshold, expected, what it tests, the hint for it)
        (a, [[b], [a[:5]], []], [0, 0, 0], 2, 1, "replica 1 holds 5 tokens of the prompt, replica 0 only 3", 1),
        (a, [[b], [a[:5]], []], [0, 3, 0], 2, 0, "the best match (replica 1) has 3 in flight, 3 more than the "
                                                 "least-loaded (0): beyond the threshold of 2, so the least-loaded", 2),
        (a, [[b], [a[:5]], []], [1, 3, 1], 2, 1, "replica 1 has 3 in flight, only 2 more than the least-loaded: "
                                                 "within the threshold, the prefix wins", 2),
        (c, [[b], [a], []], [2, 1, 0], 2, 2, "no replica holds any of the prompt: the least-loaded one", 1),
        (a, [[a[:4]], [a[:4], c], [b]], [2, 1, 0], 5, 1, "replicas 0 and 1 both hold 4 tokens: the less loaded "
                                                         "of the two", 1),
        (a, [[a], [a]], [0, 0], 0, 0, "a tie in match and in load: the lowest index", 1),
        (a, [[c, a[:2], a[:5]], [a[:3]]], [4, 0], 4, 0, "a replica holds several prompts: its longest match counts; "
                                                        "4 more in flight is not more than a threshold of 4", 1),
    ]
    for prompt, cached, loads, threshold, want, why, hint in cases:
        got = _index(call(fn, list(prompt), [[list(p) for p in held] for held in cached], list(loads), threshold),
                     len(cached), "route")
        if got == want:
            continue
        raise Wrong(f"prompt {prompt}, replicas hold {cached}, loads {loads}, threshold {threshold}: you chose "
                    f"replica {got}, expected {want} ({why})", hint=hint)
    text = "Atlas team handbook. Question one?"
    got = _index(call(fn, text, [["Borealis team"], [text[:20]]], [0, 0], 2), 2, "route on text")
    if got != 1:
        raise Wrong(f"on text prompts you chose replica {got}, expected 1 (it holds the first 20 characters): compare "
                    "the prompt with each held prompt position by position, so the rule works on token ids and text",
                    hint=1)


@exercise("11.knee", "knee of a capacity sweep", hints=(
    "Read the sweep by rising offered rate. A rate follows when its goodput is at least follow × that rate. "
    "The knee is the last rate that still follows, and None when no rate follows at all.",
    "Sort the (offered, goodput) pairs first: the sweep may come out of order. Then go through all of them: "
    "the knee is not the first rate that fails, nor the rate of the highest goodput, and a rate that dips may "
    "be followed by one that holds again. At least means ≥: goodput of exactly follow × offered follows.",
    "Sort the pairs by offered rate with `sorted(zip(offered, goodput))`, keep an answer that starts as None, and "
    "overwrite it with the offered rate of every pair whose goodput follows; what is left after the last pair is the "
    "last rate that followed.",
))
def _knee(fn: Any) -> None:
    cases = [  # (offered req/s, goodput req/s, expected knee, what it tests, the hint for it)
        ([0.5, 1.0, 2.0, 4.0], [0.5, 0.98, 1.3, 0.6], 1.0, "goodput follows up to 1.0 req/s (0.98 ≥ 0.9 × 1.0), "
                                                           "not at 2.0 (1.3 < 1.8)", 1),
        ([1.0, 2.0, 3.0], [1.0, 1.9, 2.8], 3.0, "every rate follows: the highest one tried (a lower bound)", 1),
        ([1.0, 2.0], [0.5, 0.4], None, "no rate follows: None (sweep lower rates)", 1),
        ([4.0, 1.0, 2.0], [1.0, 1.0, 1.95], 2.0, "the sweep came out of order: read it by rising rate", 2),
        ([2.0, 4.0, 1.0], [1.95, 1.0, 1.0], 2.0, "out of order again: the last rate listed that follows (1.0) is "
                                                "not the highest rate that follows", 2),
        ([1.0, 2.0, 3.0, 4.0], [1.0, 1.2, 2.9, 1.0], 3.0, "2.0 req/s dipped but 3.0 held: the last rate that follows",
         2),
        ([1.0, 2.0], [0.9, 1.79], 1.0, "0.9 × 1.0 = 0.9 counts as following (≥), 1.79 < 1.8 does not", 2),
    ]
    for i, (offered, goodput, want, why, hint) in enumerate(cases):
        # the first case has a knee: None there is the placeholder; later, None is an answer
        got = call(fn, list(offered), list(goodput), 0.9) if i == 0 else fn(list(offered), list(goodput), 0.9)
        if want is None or got is None:
            if got != want:
                raise Wrong(f"offered {offered}, goodput {goodput}: you returned {got!r}, expected {want!r} ({why})",
                            hint=hint)
            continue
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise Wrong(f"return the knee's offered rate (a number), or None; got {type(got).__name__}")
        if abs(got - want) > 1e-9:
            fails = [o for o, g in sorted(zip(offered, goodput)) if g < 0.9 * o]
            if fails and got == fails[0]:
                raise Wrong(f"offered {offered}, goodput {goodput}: you returned {got}, the first rate whose goodput "
                            f"no longer follows; the knee is the last rate that still follows: {want} ({why})",
                            hint=2)
            if got == max(o for o, g in zip(offered, goodput) if g == max(goodput)):
                raise Wrong(f"offered {offered}, goodput {goodput}: you returned {got}, the rate of the highest "
                            f"goodput; the knee is where goodput stops following the offered rate: {want} ({why})",
                            hint=2)
            raise Wrong(f"offered {offered}, goodput {goodput}: you returned {got}, expected {want} ({why})",
                        hint=hint)
