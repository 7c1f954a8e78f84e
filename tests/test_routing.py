"""labkit.serve.fleet.routing and labkit.lessons.nb11.runs without a router: the workload's shape, the routing rule,
its replay against recorded choices, the per-replica counters, and the headline's verdict; and the lab server's
additions for replicas (POST /flush_cache, --threads)."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from labkit.core import verdict
from labkit.lessons.nb11 import runs as nb11_runs
from labkit.model import models
from labkit.serve import launch, protocol
from labkit.serve.fleet import routing


@pytest.fixture(scope="module")
def tok():
    return models.load_tokenizer()


def test_workload_groups_share_a_system_prompt_and_nothing_else(tok):
    convs = routing.workload(tok, 3, 2, 2, 64, tag="-r0")
    assert len(convs) == 6 and {c.group for c in convs} == {0, 1, 2}
    by_group = {g: {c.system for c in convs if c.group == g} for g in range(3)}
    assert all(len(s) == 1 for s in by_group.values()), "one system prompt per group"
    systems = [next(iter(s)) for s in by_group.values()]
    assert len({s[0] for s in systems}) == 3, "two groups' prompts differ from their first character"
    assert all(len(tok(s)["input_ids"]) >= 64 for s in systems)
    questions = [q for c in convs if c.group == 0 for q in c.questions]
    assert len(set(questions)) == len(questions), "no two conversations of a group ask the same question"
    other = routing.workload(tok, 3, 2, 2, 64, tag="-r1")
    assert all(a.system != b.system for a, b in zip(convs, other)), "another tag: other system prompts"
    docs = routing.workload(tok, 2, 2, 2, 64, document_tokens=32)
    firsts = [c.questions[0] for c in docs]
    assert len(set(firsts)) == 4 and all(f.startswith("My notes:") for f in firsts), "each pastes a document of its own"
    assert all(not q.startswith("My notes:") for c in docs for q in c.questions[1:]), "only the first turn pastes it"
    with pytest.raises(ValueError, match="at most"):
        routing.workload(tok, 2, 7, 2, 64)
    with pytest.raises(ValueError, match="evaluation text has"):
        routing.workload(tok, 10, 1, 1, 4000)
    with pytest.raises(ValueError, match="evaluation text has"):
        routing.workload(tok, 2, 2, 1, 64, document_tokens=2000)
    with pytest.raises(ValueError, match="document_tokens=-1"):
        routing.workload(tok, 2, 2, 1, 64, document_tokens=-1)


ROUTE_CASES = [  # (prompt, cached, loads, threshold, expected)
    ([1, 2, 3], [[[1, 2]], [[1, 2, 3]]], [0, 0], 1, 1),
    ([1, 2, 3], [[[1, 2]], [[1, 2, 3]]], [0, 2], 1, 0),
    ([1, 2, 3], [[[1, 2]], [[1, 2, 3]]], [0, 1], 1, 1),
    ([9], [[[1]], [[2]], []], [3, 1, 1], 0, 1),
    ("abcd", [["abx"], ["ab"]], [0, 0], 3, 0),
]


@pytest.mark.parametrize("prompt,cached,loads,threshold,want", ROUTE_CASES)
def test_longest_prefix_route(prompt, cached, loads, threshold, want):
    assert routing.longest_prefix_route(prompt, cached, loads, threshold) == want


def test_longest_prefix_route_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="one of each per replica"):
        routing.longest_prefix_route([1], [[], []], [0], 1)


def _rec(conv, turn, worker, start, end, prompt):
    return {"conversation": conv, "turn": turn, "ok": True, "worker": worker, "start_s": start, "end_s": end,
            "prompt": prompt, "text": "", "ttft_s": 0.1, "e2e_s": end - start}


def test_replay_uses_what_the_router_did_before_each_request():
    a, b = "http://a", "http://b"
    records = [_rec("x", 1, a, 2.0, 3.0, "Atlas q1 a1 q2"),  # out of order on purpose: replay sorts by start
               _rec("x", 0, a, 0.0, 1.0, "Atlas q1"),
               _rec("y", 0, b, 1.2, 2.5, "Borealis q1"),
               _rec("z", 0, b, 1.5, 2.6, "Cobalt q1")]  # a new prefix while b is busy: the rule says a
    rows = routing.replay(records, [a, b], routing.longest_prefix_route, 5)
    assert [(r["conversation"], r["turn"]) for r in rows] == [("x", 0), ("y", 0), ("z", 0), ("x", 1)]
    assert [r["agree"] for r in rows] == [True, False, False, True]
    assert rows[1]["tie"], "y: nothing cached, both idle: a tie the rule breaks by index"
    assert not rows[2]["tie"] and rows[2]["loads"] == [0, 1], "z: b was busy, a idle: a real disagreement"
    assert rows[3]["matches"] == [len("Atlas q1"), 0]
    with pytest.raises(ValueError, match="an index from 0 to 1"):
        routing.replay(records, [a, b], lambda *args: 2, 5)


def test_cache_delta_reads_labkit_and_vllm_counters():
    before = {"labkit_prefix_cache_hits_total": 1, "labkit_prefix_cache_queries_total": 2,
              "labkit_prefix_cache_hit_tokens_total": 10, "labkit_prefix_cache_query_tokens_total": 20}
    after = {"labkit_prefix_cache_hits_total": 4, "labkit_prefix_cache_queries_total": 6,
             "labkit_prefix_cache_hit_tokens_total": 70, "labkit_prefix_cache_query_tokens_total": 120}
    d = routing.cache_delta(before, after)
    assert d["hit_rate"] == 0.75 and d["token_hit_rate"] == 0.6 and d["cache_queries"] == 4
    v = routing.cache_delta({}, {"vllm:prefix_cache_hits_total": 30.0, "vllm:prefix_cache_queries_total": 120.0})
    assert v["token_hit_rate"] == 0.25 and v["hit_rate"] is None, "vLLM counts tokens only"
    with pytest.raises(ValueError, match="prefix cache on"):
        routing.cache_delta({}, {"labkit_requests_total": 3})


def test_summarize_counts_shares_failures_and_unrouted_requests():
    a, b = "http://a", "http://b"
    recs = [_rec("x", 0, a, 0, 1, "p"), _rec("x", 1, a, 1, 2, "p"), _rec("y", 0, b, 0, 1, "q"),
            {"conversation": "y", "turn": 1, "ok": False, "error": "boom", "worker": None, "text": "", "prompt": ""}]
    deltas = [{"cache_hits": 1, "cache_queries": 2, "hit_tokens": 5, "query_tokens": 10},
              {"cache_hits": 0, "cache_queries": 1, "hit_tokens": 0, "query_tokens": 5}]
    row, per = routing.summarize("round_robin", recs, [a, b], deltas)
    assert row["answered"] == 3 and row["failed"] == 1 and row["unrouted"] == 0
    assert row["hit_rate"] == pytest.approx(1 / 3) and row["token_hit_rate"] == pytest.approx(5 / 15)
    assert [p["requests"] for p in per] == [2, 1] and row["max_share"] == pytest.approx(2 / 3)


def test_same_answers_compares_turn_by_turn():
    x = [_rec("c", 0, "a", 0, 1, "p") | {"text": "hi"}, _rec("c", 1, "a", 1, 2, "p") | {"text": "yes"}]
    y = [_rec("c", 0, "b", 0, 1, "p") | {"text": "hi"}, _rec("c", 1, "b", 1, 2, "p") | {"text": "no"}]
    assert routing.same_answers(x, x) == {"compared": 2, "identical": 2, "all_identical": True}
    assert routing.same_answers(x, y)["identical"] == 1


def test_headline_judges_ttft_paired_by_round_and_gives_no_verdict_with_too_few_pairs():
    # six rounds whose load drifts ±20 %: both policies of a round share it, so the pairs cancel it
    drift = (1.0, 1.2, 0.85, 1.1, 0.9, 1.15)
    runs = [{"policy": p, "round": r, "ttft_p50_s": base * d, "hit_rate": h, "token_hit_rate": h, "ttft_p90_s": base * d,
             "max_share": 0.5, "requests": 8, "failed": 0}
            for p, base, h in (("round_robin", 1.0, 0.5), ("cache_aware", 0.85, 0.75)) for r, d in enumerate(drift)]
    head = nb11_runs.headline(nb11_runs.policy_table(runs), runs, None, None, {"all_identical": True})
    assert head["ttft_verdict"] == "better" and head["ttft_pairs"] == 6
    assert head["ttft_verdict_reason"].startswith("paired sign-flip test, 6 pairs: p = 0.031")
    assert head["cache_aware_hit_rate"] == 0.75 and head["answers_identical_to_one_server"] is True
    unpaired = [r["ttft_p50_s"] for r in runs if r["policy"] == "cache_aware"]
    assert verdict.compare(unpaired, [r["ttft_p50_s"] for r in runs if r["policy"] == "round_robin"],
                           higher_is_better=False).kind != "better", "unpaired, the drift hides the 15 %"
    shuffled = sorted(runs, key=lambda r: (r["round"] * 7) % 5)  # the order rows arrive in does not matter
    assert nb11_runs.ttft_verdict(shuffled).ratio == pytest.approx(0.85)
    few = [r for r in runs if r["round"] < 4]
    v = nb11_runs.headline(nb11_runs.policy_table(few), few, None, None, None)
    assert v["ttft_verdict"] == "no verdict" and v["ttft_verdict_label"] == "no verdict (4 pairs)"
    lost = [r for r in runs if not (r["policy"] == "cache_aware" and r["round"] == 5)]  # a round one policy lacks
    assert nb11_runs.ttft_verdict(lost).n == 5


def test_flush_cache_endpoint_and_its_absence():
    with launch.run_server(protocol.TINY_RANDOM, port=0, batching="continuous", prefix_cache_tokens=2048) as srv:
        body = json.dumps({"prompt": "the same long prompt " * 8, "max_tokens": 2}).encode()
        for _ in range(2):
            urllib.request.urlopen(urllib.request.Request(srv.url + "/v1/completions", data=body), timeout=30).read()
        cache = srv.server.batcher.prefix_cache
        assert cache.hits == 1 and cache.entries
        req = urllib.request.Request(srv.url + "/flush_cache", data=b"{}", method="POST")
        assert json.loads(urllib.request.urlopen(req, timeout=30).read())["flushed"] == 1
        assert not cache.entries and cache.hits == 1 and cache.tokens == 0, "entries gone, counters kept"
    with launch.run_server(protocol.TINY_RANDOM, port=0) as srv:
        req = urllib.request.Request(srv.url + "/flush_cache", data=b"{}", method="POST")
        out = json.loads(urllib.request.urlopen(req, timeout=30).read())
        assert out["flushed"] == 0 and "--prefix-cache-tokens" in out["message"]


def test_cli_threads_must_be_positive():
    proc = subprocess.run([sys.executable, "-m", "labkit", "serve", "--threads", "0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "threads=0" in proc.stderr and "Traceback" not in proc.stderr


def test_compare_policies_warms_each_router_up_then_runs_shuffled_rounds(monkeypatch):
    calls = []

    def fake_run(url, policy, replicas, workload, max_tokens, **kw):
        calls.append((policy, workload[0]))
        return {"summary": {"policy": policy, "ttft_p50_s": 1.0}, "replicas": [{"replica": 0}], "records": [workload[0]]}

    monkeypatch.setattr(nb11_runs.routing, "run_policy", fake_run)
    routers = {"round_robin": type("R", (), {"url": "a"})(), "cache_aware": type("R", (), {"url": "b"})()}
    works = [[f"w{r}"] for r in range(6)]
    out = nb11_runs.compare_policies(routers, [], works, 2, warmup=["warm"])
    assert calls[:2] == [("round_robin", "warm"), ("cache_aware", "warm")], "one warm-up run per router first"
    assert all(w != "warm" for _, w in calls[2:]) and len(calls) == 2 + 12
    assert sorted((r["policy"], r["round"]) for r in out["runs"]) == sorted(
        (p, r) for p in routers for r in range(6)), "the warm-up is not a round"
    assert [calls[2 + 2 * r][1] for r in range(6)] == [f"w{r}" for r in range(6)], "round r runs workload r"
    orders = {tuple(p for p, _ in calls[2 + 2 * r:4 + 2 * r]) for r in range(6)}
    assert len(orders) == 2, "the rounds' order is shuffled: each policy goes first in some round"
