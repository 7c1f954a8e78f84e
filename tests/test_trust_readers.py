"""Notebook 14's A/A and A/B readers: one run each, the old overlap rule, a request bootstrap and the paired test, on
simulated drifting passes (real and resampled trials), and the whole run over the tiny server through two proxies."""
from __future__ import annotations

import json
import math
import random

import pytest

from labkit.core import verdict
from labkit.lessons.nb14 import findings as f14
from labkit.lessons.nb14 import runs as nb14
from labkit.serve.clients import readers


def drifting(rounds, *, seed, requests=4, walk=0.05, bound=0.15, noise=0.05, tpot=0.05):
    """Recorded A/A rounds: the machine's pace a bounded random walk (±15 %) between rounds, both passes of a round
    at its pace; each request's TPOT with 5 % noise of its own."""
    rng = random.Random(seed)
    level, a, b = 1.0, [], []
    for _ in range(rounds):
        level = min(1 + bound, max(1 - bound, level * math.exp(rng.gauss(0, walk))))
        a.append([tpot * level * math.exp(rng.gauss(0, noise)) for _ in range(requests)])
        b.append([tpot * level * math.exp(rng.gauss(0, noise)) for _ in range(requests)])
    return {"A": a, "B": b}


def test_read_calls_only_a_slowdown_in_the_slowdown_direction():
    a = [[1.0, 1.01, 0.99, 1.0]] * 8
    faster = [[0.8, 0.81, 0.79, 0.8]] * 8
    row = readers.read(a, faster, slow=True, resamples=200)
    assert row["paired_kind"] == verdict.BETTER and not row["paired"] and not row["naive"]  # faster is not caught
    assert readers.read(a, faster, slow=False, resamples=200)["paired"]  # but in A/A it is a false positive
    assert row["pairs"] == 8 and row["paired_p"] is not None


def test_the_paired_reader_meets_the_goal_where_one_run_each_and_the_overlap_rule_do_not():
    rec = drifting(40, seed=7)
    rows = readers.resampled_trials(rec, pairs=16, trials=200, per_token_s=0.1 * 0.05, resamples=200)
    r = readers.rates(rows)
    assert r["paired"]["aa_false_positive_rate"] <= 0.08, r
    assert r["paired"]["slowdown_detection_rate"] >= 0.9, r
    assert r["naive"]["aa_false_positive_rate"] > 0.2, r  # a 2 % step, with 5 % noise a pass
    assert r["overlap"]["slowdown_detection_rate"] < 0.5, r  # the drift spreads the passes' medians past the change
    table = {row["reader"]: row for row in readers.reader_table([], rows)}
    assert table["paired"]["meets_goal"] and not table["naive"]["meets_goal"] and not table["overlap"]["meets_goal"]
    assert table["paired"]["aa_fp_real"] is None  # no real trials: the real columns say so


def test_a_chance_difference_in_the_recording_is_not_drawn_into_the_resampled_a_a_trials():
    """A recording whose B passes happen to run 3 % slower on average (chance, or a setup that is not quite A/A):
    drawn with their labels, every A/A trial would carry that 3 %; drawn with the labels at random, the A/A trials
    sample no difference, and the slowdown trials still carry the slowdown."""
    rec = drifting(100, seed=3)
    rec["B"] = [[x * 1.03 for x in p] for p in rec["B"]]
    rows = readers.resampled_trials(rec, pairs=16, trials=200, per_token_s=0.1 * 0.05,
                                    bootstrap=lambda new, base, resamples: (0.0, 0.0))  # only the paired reader here
    r = readers.rates(rows)
    assert r["paired"]["aa_false_positive_rate"] <= 0.06, r
    assert r["paired"]["slowdown_detection_rate"] >= 0.9, r
    a_a = [row["paired_ratio"] for row in rows if row["trial"] == "A/A"]
    assert sum(x > 1 for x in a_a) / len(a_a) == pytest.approx(0.5, abs=0.1), "no side is the slow one by label"


def test_real_trials_are_consecutive_blocks_and_a_short_rest_is_left_out():
    rec = drifting(13, seed=1)
    rows = readers.real_trials(rec, 6, slow=False)
    assert [r["index"] for r in rows] == [0, 1] and all(r["pairs"] == 6 and r["source"] == "real" for r in rows)
    assert readers.rates(rows)["paired"]["slowdown_detection_rate"] is None


def test_resampled_trials_stay_out_of_the_verdict_log_and_real_ones_go_in(tmp_path, monkeypatch):
    log = tmp_path / "v.jsonl"
    monkeypatch.setenv(verdict.LOG_ENV, str(log))
    rec = drifting(12, seed=2)
    readers.resampled_trials(rec, pairs=6, trials=5, per_token_s=0.005, resamples=50)
    assert not log.exists()
    readers.real_trials(rec, 6, slow=False)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted(x["how"] for x in lines) == ["compare", "compare", "paired", "paired"]
    assert verdict.LOG_ENV in __import__("os").environ  # put back


def test_meets_reads_alpha_and_power():
    assert readers.meets({"aa_false_positive_rate": verdict.ALPHA, "slowdown_detection_rate": verdict.POWER})
    assert not readers.meets({"aa_false_positive_rate": verdict.ALPHA + 0.01, "slowdown_detection_rate": 1.0})
    assert not readers.meets({"aa_false_positive_rate": 0.0, "slowdown_detection_rate": verdict.POWER - 0.01})
    assert not readers.meets({"aa_false_positive_rate": None, "slowdown_detection_rate": 1.0})


def test_sigma_d_is_the_spread_of_the_pairs_log_ratios():
    rec = {"A": [[1.0], [2.0], [1.0]], "B": [[1.1], [2.0], [0.9]]}
    want = __import__("statistics").stdev([math.log(1.1), 0.0, math.log(0.9)])
    assert readers.sigma_d(rec) == pytest.approx(want)
    with pytest.raises(ValueError, match="2 recorded pairs"):
        readers.sigma_d({"A": [[1.0]], "B": [[1.0]]})


def _ab(table_meets, *, pairs=6, needed=6):
    rates = {k: {"aa_false_positive_rate": 0.5, "slowdown_detection_rate": 0.5} for k in readers.READERS}
    return {"table": [{"reader": k, "aa_fp_resampled": 0.5, "detected_resampled": 0.5, "meets_goal": k in table_meets}
                      for k in readers.READERS], "resampled_rates": rates, "rates": rates, "resampled_trials": 200,
            "pairs": pairs, "needed": needed, "afforded": pairs >= needed, "aa_trials": 2, "ab_trials": 1, "aa_pairs": 6, "requests_per_pass": 4,
            "slowdown_share": 0.1, "sigma_d": 0.05}


def test_the_sentences_name_only_the_readers_that_met_the_goal():
    said = f14.readers_sentence(_ab(["paired"]))
    assert "Met at most 5 % false positives and at least 90 % detection: paired." in said.replace("5%", "5 %") \
        .replace("90%", "90 %")
    assert "Only paired met" in f14.aa_sentence(_ab(["paired"]))
    none = f14.readers_sentence(_ab([], pairs=6, needed=14))
    assert "No reader met" in none and "none here tells a 10% slowdown from nothing" in none
    assert "asked for 14 pairs" in none and "made 6" in none
    assert "None met" in f14.aa_sentence(_ab([])) and "Only" not in f14.aa_sentence(_ab([]))
    assert "Every reader met" in f14.aa_sentence(_ab(list(readers.READERS)))
    assert not f14.afforded(_ab([], pairs=6, needed=7)) and f14.afforded(_ab([], pairs=7, needed=7))


def test_aa_ab_over_the_tiny_server_records_pairs_and_sizes_the_slowdown(server):
    seen = {}

    def ask(sd, change):
        seen.update(sd=sd, change=change)
        return 9

    out = nb14.aa_ab(server.url, ["Tell me a story about a lighthouse."], model=None, aa_trials=1, pairs=6,
                     slowdown=4.0, requests=2, max_tokens=4, concurrency=2, ab_pairs=ask, max_ab_pairs=7,
                     resampled=10, on_sized=lambda z: seen.update(sized=dict(z)))
    assert seen["change"] == 4.0 and seen["sd"] == pytest.approx(out["sigma_d"]) and out["sigma_d"] >= 0
    assert out["needed"] == 9 and out["pairs"] == 7 and not out["afforded"]  # capped by what the run affords
    assert out["per_token_s"] == pytest.approx(4.0 * out["tpot_a_s"]) and seen["sized"]["pairs"] == 7
    assert out["passes"] == 1 + 2 * 6 + 2 * 7  # the thrown-away pass, the A/A rounds, the A/B rounds
    assert [r["trial"] for r in out["rows"]] == ["A/A", "A/B"] and out["rows"][1]["pairs"] == 7
    assert len(out["resampled_rows"]) == 20 and {r["reader"] for r in out["table"]} == set(readers.READERS)
    assert out["measured_slowdown"] > 0.5  # the proxy's delay (4× a token's time) shows on the B side, whatever the
    # tiny server's own noise
    assert len(out["recording"]["order"]) == 6 and {tuple(sorted(o)) for o in out["recording"]["order"]} == {("A", "B")}


def test_the_anchored_sentence_names_the_largest_deviation_with_its_range_and_the_anchors_own():
    fig = lambda d, r: {"deviation": d, "range": r, "ratios": []}  # noqa: E731
    a = {"anchor": "labkit", "max": {"value": -0.07, "client": "AIPerf", "metric": "tpot_p50_s"},
         "per_client": {"AIPerf": {"pairs": 3, "tpot_p50_s": fig(-0.07, 0.12)},
                        "labkit": {"pairs": 2, "tpot_p50_s": fig(0.0, 0.05), "output_tokens_per_s": fig(0.0, None)}}}
    said = f14.anchored_sentence(a)
    assert "-7.0% (AIPerf, p50 TPOT, median of 3 pairs; pass-to-pass range 12.0%; no pair to judge)" in said
    a["per_client"]["AIPerf"]["tpot_p50_s"]["ratios"] = [0.9, 0.93, 0.95]
    assert "not told apart from the drift" in f14.anchored_sentence(a) and "run " in f14.anchored_sentence(a)
    a["per_client"]["AIPerf"]["tpot_p50_s"]["ratios"] = [0.9, 0.93, 0.95, 0.92, 0.91, 0.94, 0.93]
    assert "a real difference: paired sign-flip test, 7 pairs" in f14.anchored_sentence(a)
    a["per_client"]["AIPerf"]["tpot_p50_s"]["ratios"] = []
    assert "p50 TPOT pass-to-pass range 5.0%" in said
    assert "tokens/s no pass-to-pass range (one pair)" in said  # a single ratio has no range
    assert said.startswith("largest aligned deviation from labkit's runs either side of it: -7.0%")
    assert f14.anchored_sentence(a, lead="up to").startswith("up to -7.0% (AIPerf")  # the takeaway's own words
    none = dict(a, max={"value": 0.0, "client": None, "metric": None})
    assert f14.anchored_sentence(none).startswith("no client had a pair")


def test_a_reader_that_met_the_goal_only_on_the_resampled_trials_is_named_with_what_the_real_trials_can_tell():
    ab = _ab([])
    ab.update(aa_trials=10, ab_trials=10)
    for row in ab["table"]:
        row.update(aa_fp_real=0.5, detected_real=0.5)
    paired = next(r for r in ab["table"] if r["reader"] == "paired")
    paired.update(aa_fp_resampled=0.04, detected_resampled=0.91, aa_fp_real=0.1, detected_real=1.0)
    said = f14.readers_sentence(ab)
    # 1 false alarm in 10: a reader exactly at 5 % raises one or more in 1 − 0.95¹⁰ = 40 % of such runs
    assert "paired met it on the resampled trials, not on the real ones" in said and "40%" in said
    assert "cannot tell it from a reader at the goal" in said and "none here tells" not in said
    assert "paired met it on the resampled trials" in f14.aa_sentence(ab)
    paired.update(aa_fp_real=0.4, detected_real=0.5)  # 4 alarms and 5 misses in 10: far off the goal
    said = f14.readers_sentence(ab)
    assert "the real trials say it fell short" in said and "5 misses in 10 A/B" in said
    paired.update(aa_fp_resampled=0.2)  # not met on the resampled trials either: the general sentence
    assert "none here tells" in f14.readers_sentence(ab)
