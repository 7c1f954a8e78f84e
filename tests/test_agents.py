"""Agent sessions as requests (labkit.serve.agents.trace) and the prefix lint that says whether a turn extends the
last one, with the cause when it does not: every cause the notebook teaches, and the command's exit codes."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.serve.agents import prefix_lint as pl
from labkit.serve.agents import tiers, toolcalls
from labkit.serve.agents import trace as tr

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def session() -> tr.Session:
    return tr.trace(1, 6, seed=3, system_words=30)[0]


# ------------------------------------------------------------------------------------------------ the trace


def test_the_trace_is_seeded_and_sized():
    a, b, c = tr.trace(3, 4, seed=7), tr.trace(3, 4, seed=7), tr.trace(3, 4, seed=8)
    assert [s.requests for s in a] == [s.requests for s in b], "the same seed gives the same requests"
    assert [s.requests for s in a] != [s.requests for s in c], "another seed gives others"
    assert len(a) == 3 and all(s.turns == 4 for s in a)
    for s in a:
        assert [len(r["messages"]) for r in s.requests] == [2, 4, 6, 8]  # each turn adds a tool call and its result
        assert all(len(r["tools"]) == len(tr.TOOLS) for r in s.requests)
    longer = tr.trace(1, 2, seed=7, system_words=200)[0].requests[0]["messages"][0]["content"]
    assert len(longer.split()) > 200 > len(a[0].requests[0]["messages"][0]["content"].split())
    with pytest.raises(ValueError, match="sessions"):
        tr.trace(0, 4)
    with pytest.raises(ValueError, match="system_words"):
        tr.trace(1, 4, system_words=-1)


def test_tool_results_vary_in_length_and_calls_carry_json_arguments():
    results = [len(json.loads(m["content"])["passages"][0].split()) for s in tr.trace(4, 6, seed=1)
               for m in s.requests[-1]["messages"] if m["role"] == "tool"]
    assert min(results) < 60 < max(results), results
    call = tr.trace(1, 2, seed=1)[0].requests[1]["messages"][2]
    assert call["content"] is None and isinstance(json.loads(call["tool_calls"][0]["function"]["arguments"]), dict)


def test_every_turn_of_a_clean_session_extends_the_last(session):
    for old, new in zip(session.requests, session.requests[1:]):
        found = pl.lint(old, new)
        assert found.extends and found.verdict == pl.EXTENDS and "adds 2 messages" in found.cause, found


def test_an_unknown_buster_is_refused(session):
    with pytest.raises(ValueError, match="choose one of"):
        tr.bust(session, "cosmic_rays")


# ------------------------------------------------------------------------------------------------ the lint


@pytest.mark.parametrize(("kind", "field", "words"), [
    ("timestamp", "messages[0].content", "a changing value in the system prompt: '2026-12-06T09:00:"),
    ("tools_reordered", "tools[", "tools reordered:"),
    ("json_keys", "messages[3].content", "a reordered JSON object: the tool message's JSON"),
])
def test_each_buster_is_named_at_its_field(session, kind, field, words):
    busted = tr.bust(session, kind).requests
    found = pl.lint(busted[2], busted[3])
    assert not found.extends and found.field.startswith(field) and words in found.cause, found.line()


def test_an_edited_earlier_turn_is_named_and_the_session_goes_on(session):
    busted = tr.bust(session, "edited_history").requests
    middle = len(busted) // 2
    found = pl.lint(busted[middle - 1], busted[middle])
    assert found.field == "messages[1].content" and "a changed earlier turn: the user message 1 was edited" in found.cause
    assert pl.lint(busted[middle], busted[middle + 1]).extends, "after the edit, the next turn extends the edited one"


def test_json_reordered_in_a_tool_definition_and_in_a_calls_arguments(session):
    old, new = copy.deepcopy(session.requests[2]), copy.deepcopy(session.requests[3])
    fn = new["tools"][1]["function"]
    new["tools"][1]["function"] = {k: fn[k] for k in reversed(list(fn))}
    found = pl.lint(old, new)
    assert found.field == "tools[1]" and "a reordered JSON object: tool 'read_file'" in found.cause
    new = copy.deepcopy(session.requests[3])
    call = new["messages"][2]["tool_calls"][0]["function"]
    call["arguments"] = json.dumps(dict(reversed(list(json.loads(call["arguments"]).items()))) | {"extra": 1})
    assert "tool_calls" in pl.lint(old, new).field and "changed" in pl.lint(old, new).cause, "other data: a change"
    args = {"b": 1, "a": 2}
    old["messages"].append({"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "f", "arguments": json.dumps(args)}}]})
    new = copy.deepcopy(old)
    new["messages"][-1]["tool_calls"][0]["function"]["arguments"] = json.dumps(dict(reversed(list(args.items()))))
    new["messages"].append({"role": "tool", "tool_call_id": "x", "content": "{}"})
    found = pl.lint(old, new)
    assert found.field.endswith(".tool_calls") and "a tool call's arguments carry the same data" in found.cause


def test_a_truncated_history_and_a_changed_tool_list(session):
    old, new = session.requests[3], copy.deepcopy(session.requests[3])
    new["messages"] = new["messages"][:2] + new["messages"][4:]
    assert not pl.lint(old, new).extends
    short = copy.deepcopy(session.requests[1])
    found = pl.lint(session.requests[3], short)
    assert found.field == "messages[4]" and "earlier turns dropped" in found.cause
    fewer = copy.deepcopy(session.requests[4])
    fewer["tools"] = fewer["tools"][:-1]
    assert "the tool list changed" in pl.lint(session.requests[3], fewer).cause


def test_a_changing_value_elsewhere_than_the_system_prompt(session):
    old, new = copy.deepcopy(session.requests[2]), copy.deepcopy(session.requests[3])
    old["messages"][1]["content"] += " request id 7f3a9c2e-1b2c-4d5e-8f90-123456789abc"
    new["messages"][1]["content"] += " request id 0a1b2c3d-1b2c-4d5e-8f90-123456789abc"
    assert "a changing value in an earlier user message" in pl.lint(old, new).cause


def test_identical_requests_extend_and_shared_prefix_counts_tokens(session):
    assert pl.lint(session.requests[2], session.requests[2]).extends
    assert pl.shared_prefix([1, 2, 3, 4], [1, 2, 3, 4, 5, 6]) == 4
    assert pl.shared_prefix([1, 2, 9], [1, 2, 3, 4]) == 2 and pl.shared_prefix([], [1]) == 0


@pytest.mark.parametrize(("body", "words"), [
    ([1, 2], "not an object"), ({"prompt": "hi"}, 'no "messages" list'), ({"messages": []}, 'no "messages" list'),
    ({"messages": [{"content": "hi"}]}, 'messages[0] has no "role"'),
    ({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}, '"tools" is a dict'),
])
def test_a_body_that_is_not_a_chat_request_names_the_fix(body, words):
    with pytest.raises(pl.NotARequest, match=words.replace("[", r"\[").replace("]", r"\]")):
        pl.lint(body, {"messages": [{"role": "user", "content": "x"}]})


# ------------------------------------------------------------------------------------------------ the command


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", "prefix-lint", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_the_command_exits_0_1_and_2(tmp_path, session):
    files = {}
    busted = tr.bust(session, "timestamp").requests
    for name, body in (("a", session.requests[1]), ("b", session.requests[2]), ("c", busted[1]), ("d", busted[2])):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(body), encoding="utf-8")
    ok = _run(str(files["a"]), str(files["b"]))
    assert ok.returncode == 0 and ok.stdout.startswith("extends"), ok.stdout + ok.stderr
    bad = _run(str(files["c"]), str(files["d"]), "--json")
    out = json.loads(bad.stdout)
    assert bad.returncode == 1 and out["verdict"] == pl.BUSTED and out["field"] == "messages[0].content"
    (tmp_path / "x.json").write_text("{not json", encoding="utf-8")
    for args, words in (([str(tmp_path / "x.json"), str(files["a"])], "is not JSON"),
                        ([str(tmp_path / "none.json"), str(files["a"])], "no such file")):
        err = _run(*args)
        assert err.returncode == 2 and words in err.stderr and "Traceback" not in err.stderr, err.stderr


# ------------------------------------------------------------------------------------------------ tool calls



def _completion(content=None, tool_calls=None):
    return {"choices": [{"message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}]}


def test_where_a_call_lands_and_whether_it_conforms():
    tools = list(tr.TOOLS)
    structured = _completion(tool_calls=[{"id": "c", "type": "function", "function": {
        "name": "read_file", "arguments": json.dumps({"path": "a.py", "start_line": 3})}}])
    assert toolcalls.calls(structured, tools) == ("tool_calls", [{"name": "read_file",
                                                                  "arguments": {"path": "a.py", "start_line": 3}}])
    in_text = _completion('Sure. {"name": "search_notes", "arguments": {"query": "kv cache"}} done')
    assert toolcalls.calls(in_text, tools)[0] == "content"
    unknown = _completion('{"name": "delete_everything", "arguments": {}}')
    assert toolcalls.calls(unknown, tools) == ("none", []) and toolcalls.calls(_completion("Hello"), tools)[0] == "none"
    assert toolcalls.conforms({"name": "read_file", "arguments": {"path": "a.py"}}, tools)
    assert not toolcalls.conforms({"name": "read_file", "arguments": {"start_line": 3}}, tools), "path is required"
    assert not toolcalls.conforms({"name": "read_file", "arguments": {"path": 3}}, tools), "path is a string"
    assert not toolcalls.conforms({"name": "read_file", "arguments": "not json"}, tools)


def test_the_conformance_table_counts_each_tool_choice():
    tools = list(tr.TOOLS)
    good = _completion(tool_calls=[{"function": {"name": "run_tests", "arguments": '{"pattern": "kv"}'}}])
    bad = _completion(tool_calls=[{"function": {"name": "run_tests", "arguments": '{"timeout_s": 3}'}}])
    text = _completion('{"name": "write_note", "arguments": {"text": "hi"}}')
    rows = toolcalls.table({"auto": [text, _completion("no call"), {**good, "tokens_per_s": 10.0}],
                            "required": [good, bad, {**good, "tokens_per_s": 6.0}, {**good, "tokens_per_s": 8.0}]}, tools)
    auto, required = rows
    assert (auto["requests"], auto["in_tool_calls"], auto["in_content"], auto["in_none"], auto["conforming"]) == (3, 1, 1, 1, 2)
    assert (required["in_tool_calls"], required["conforming"], required["tokens_per_s"]) == (4, 3, 7.0)  # median of 6, 8
    assert required["conforming_share"] == 0.75
    cut = {"choices": [{"message": {"content": "<tool_call>\n{\"name\": \"run_tests\", \"argu"}, "finish_reason": "length"}]}
    (row,) = toolcalls.table({"named": [cut, good]}, tools)
    assert (row["cut_off"], row["in_none"], row["conforming"]) == (1, 1, 1), "a call cut at max_tokens lands nowhere"


def test_a_tool_body_per_choice_and_the_strict_flag():
    from labkit.lessons.nb13 import runs as nb13_runs

    req = tr.trace(1, 1, seed=0)[0].requests[0]
    named = nb13_runs.tool_body(req, "named", 32)
    assert named["tool_choice"] == {"type": "function", "function": {"name": "search_notes"}}
    loose = nb13_runs.tool_body(req, "required, not strict", 32)
    assert loose["tool_choice"] == "required" and not any(t["function"]["strict"] for t in loose["tools"])
    assert all(t["function"]["strict"] for t in nb13_runs.tool_body(req, "required", 32)["tools"])
    assert all(t["function"]["strict"] for t in tr.TOOLS), "the trace's own tools are left as they were"
    with pytest.raises(ValueError, match="choose one of"):
        nb13_runs.tool_body(req, "sometimes", 32)


# ------------------------------------------------------------------------------------------------ tiers


def test_reload_beats_recompute_past_the_crossover():
    # 24 KiB a token from a 1 GB/s disk (24.6 µs) against 2,000 prefill tokens/s (500 µs), 5 ms to start
    c = tiers.crossover(24 * 1024, 1e9, 2000.0, start_s=0.005)
    n = c["tokens"]
    assert n == 11 and "reloading wins from 11 tokens" in c["reason"]
    assert tiers.reload_s(n, 24 * 1024, 1e9, 0.005) < tiers.recompute_s(n, 2000.0)
    assert tiers.reload_s(n - 1, 24 * 1024, 1e9, 0.005) >= tiers.recompute_s(n - 1, 2000.0)
    never = tiers.crossover(24 * 1024, 1e6, 2000.0)  # a 1 MB/s tier: slower than computing
    assert never["tokens"] is None and "recomputing always wins" in never["reason"]
    with pytest.raises(ValueError, match="bandwidth_bytes_s"):
        tiers.crossover(1, 0, 1)


def test_resident_sessions_in_a_budget():
    assert tiers.resident_sessions(1 << 30, 24 * 1024, 4096) == 10  # 1 GiB ÷ (24 KiB × 4096 = 96 MiB)
    assert tiers.resident_sessions(50 * 1024, 24 * 1024, 4096) == 0
    with pytest.raises(ValueError, match="tokens_per_session"):
        tiers.resident_sessions(1, 1, 0)


# ------------------------------------------------------------------------------------------------ rendering, notebook 13


@pytest.fixture(scope="module")
def smol_tokenizer():
    from labkit.model import models

    try:
        path = models.resolve()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"the default model is not installed here: {exc}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_the_tool_template_renders_tools_calls_and_results_so_each_turn_extends(smol_tokenizer):
    s = tr.trace(1, 3, seed=5)[0]
    ids = [tr.render(b, smol_tokenizer) for b in s.requests]
    text = smol_tokenizer.decode(ids[2])
    assert '<tools>' in text and '"name": "search_notes"' in text and "<tool_call>" in text and "<tool_response>" in text
    for old, new in zip(ids, ids[1:]):  # everything but the last turn's "assistant" opening comes back
        assert pl.shared_prefix(old, new) >= len(old) - 3
    reordered = [tr.render(b, smol_tokenizer) for b in tr.bust(s, "tools_reordered").requests]
    assert pl.shared_prefix(reordered[0], reordered[1]) < 100, "the tools come first: a new order busts nearly all"
    pinned = tr.pin_clock(s)
    assert all(pl.lint(o, n).extends for o, n in zip(pinned.requests, pinned.requests[1:]))
    stamped = tr.bust(s, "timestamp")
    assert not pl.lint(stamped.requests[0], stamped.requests[1]).extends


def test_tool_parameters_are_strict_and_ascii_only():
    assert all(t["function"]["parameters"]["additionalProperties"] is False for t in tr.TOOLS)
    body = tr.trace(2, 4, seed=1)[1].requests[-1]
    assert json.dumps(body).isascii(), "English prose only: other scripts would be escaped into long \\u runs"


def test_served_tokens_first_field_and_the_spill_policy():
    assert pl.served_tokens([[1, 2, 3], [1, 2, 4], [9], [1, 2, 3, 5]]) == [0, 2, 0, 3]
    s = tr.trace(1, 4, seed=3)[0]
    assert pl.first_field(s.requests[1], s.requests[2]) is None
    assert pl.first_field(*tr.bust(s, "tools_reordered").requests[1:3]) == "tools"
    assert pl.first_field(*tr.bust(s, "json_keys").requests[1:3]) == "messages[3]"
    assert tiers.spill(512, 512) and not tiers.spill(511, 512) and not tiers.spill(10**6, None)


def test_replay_order_summary_and_block_rounding():
    from labkit.lessons.nb13 import runs as nb13_runs

    prompts = [[[1] * 40, [1] * 70], [[1] * 50]]
    assert nb13_runs.order(prompts) == [(0, 0), (1, 0), (0, 1)]
    served = {(0, 0): 0, (1, 0): 40, (0, 1): 70}
    assert nb13_runs.served_by_block(served, prompts, 16) == {(0, 0): 0, (1, 0): 32, (0, 1): 64}
    rows = [{"session": 0, "turn": 0, "prompt_tokens": 40, "cached_tokens": 0, "ttft_s": 0.4},
            {"session": 1, "turn": 0, "prompt_tokens": 50, "cached_tokens": 32, "ttft_s": 0.2},
            {"session": 0, "turn": 1, "prompt_tokens": 70, "cached_tokens": 64, "ttft_s": 0.1}]
    whole, later = nb13_runs.summary(rows, "x"), nb13_runs.summary(rows, "x", skip_first_turn=True)
    assert whole["cached_share"] == pytest.approx(96 / 160) and later["requests"] == 1
    assert later["ttft_per_token_s"] == [pytest.approx(0.1 / 70)]
    def tier_rows(rounds: int) -> list[dict]:
        return [{"tokens": n, "way": w, "round": r, "ttft_s": t * (1 + 0.01 * r), "cached_tokens": 0, "answer": []}
                for r in range(rounds) for n, w, t in ((128, "reload", 0.3), (128, "recompute", 0.2),
                                                       (1024, "reload", 0.2), (1024, "recompute", 1.5))]

    table = nb13_runs.tier_table(tier_rows(6))  # six rounds: six pairs per length
    assert [r["reload_verdict"] for r in table] == ["worse", "better"]
    assert table[1]["reload_verdict_reason"].startswith("paired sign-flip test, 6 pairs: p = 0.031")
    assert nb13_runs.measured_crossover(table) == 1024
    assert nb13_runs.measured_crossover(table[:1]) is None
    three = nb13_runs.tier_table(tier_rows(3))  # three pairs: a 7.5x gap is still no verdict
    assert nb13_runs.measured_crossover(three) is None and three[1]["reload_verdict"] == "no verdict"
    assert "3 pairs: a paired test needs at least 6; run 3 more pairs" in three[1]["reload_verdict_reason"]


def test_perfect_served_the_busted_verdict_the_tier_prediction_and_a_refusal():
    from labkit.core import verdict
    from labkit.lessons.nb13 import runs as nb13_runs
    from labkit.serve import client

    prompts = [[[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]], [[1, 2, 9]]]
    assert nb13_runs.perfect_served(prompts) == {(0, 0): 0, (1, 0): 2, (0, 1): 4}
    assert nb13_runs.perfect_served(prompts, block=2) == {(0, 0): 0, (1, 0): 2, (0, 1): 4}
    assert nb13_runs.perfect_served(prompts, lambda ps: [len(p) for p in ps]) == {(0, 0): 4, (1, 0): 3, (0, 1): 6}

    def rows(per_token):
        return [{"session": s, "turn": t, "prompt_tokens": 100, "cached_tokens": 0 if per_token > 1 else 80,
                 "ttft_s": (5.0 if t == 0 else per_token) * (1 + s / 100)} for s in range(4) for t in range(4)]

    whole, judged = nb13_runs.busted_against_clean({"clean": rows(0.5), "timestamp": rows(1.5)})
    assert whole["clean"]["cached_share"] == 0.8 and judged.ratio == pytest.approx(3.0, rel=0.05)
    assert judged.kind == "worse", "turn 0 (equal in both) is left out: the later turns are 3× slower"
    assert not judged.paired, "two replays one after the other: nothing pairs them"
    # replay_rounds' rows: the same request of both runs timed in one round, judged paired on turns 1 on
    drift = [1.0, 1.3, 0.8, 1.2, 0.9, 1.1, 1.25, 0.85, 1.0, 1.15, 0.95, 1.05, 0.9, 1.2, 1.0, 0.8]
    def paired_rows(per_token, gain):
        return [dict(r, round=k, ttft_s=r["ttft_s"] * drift[k] * (gain if r["turn"] else 1.0))
                for k, r in enumerate(rows(per_token))]
    _, judged = nb13_runs.busted_against_clean({"clean": paired_rows(0.5, 1.0), "timestamp": paired_rows(0.5, 1.1)})
    assert judged.paired and judged.n == 12 and judged.kind == "worse" and judged.ratio == pytest.approx(1.1)
    pooled = verdict.compare([r["ttft_s"] for r in paired_rows(0.5, 1.1) if r["turn"]],
                             [r["ttft_s"] for r in paired_rows(0.5, 1.0) if r["turn"]], higher_is_better=False)
    assert pooled.kind != "worse", "pooled over requests, the drift hides the 10 %"

    tier = [{"tokens": n, "way": "recompute", "ttft_s": t} for n, t in ((1024, 2.0), (1024, 1.0), (128, 0.5))]
    found = nb13_runs.tier_prediction(tier, {"bytes_per_s": 1e9, "start_s": 0.01}, 1e5)
    assert found["prefill_tokens_per_s"] == 1024 and found["tokens"] == tiers.crossover(1e5, 1e9, 1024, 0.01)["tokens"]

    said = client.refusal({"status": 400, "data": {"error": {"message": "too long", "param": "prompt"}}})
    assert said == {"status": 400, "message": "too long", "param": "prompt"}
    assert client.refusal({"status": 500, "data": "boom"})["message"] == "{'error': 'boom'}"


def test_replay_rounds_pair_each_request_and_each_server_sees_the_replay_order():
    """Two runs of one trace on two servers, request by request in shuffled rounds: every row keeps its round (its
    pair), each server got its requests in ``order``, so its cache served what one ``replay`` would have, and the
    warm-up request left nothing behind in the cache (it was flushed)."""
    from labkit.lessons.nb13 import runs as nb13_runs
    from labkit.serve import launch, protocol

    base = list(range(5, 69))  # 64 tokens every turn starts with: a block cache serves them from turn 1 on
    clean = [[base + [100 + s] * 3, base + [100 + s] * 3 + [7] * 20] for s in range(2)]
    busted = [[[1 + s] + p[1:] for p in session] for s, session in enumerate(clean)]  # a changed first token per session
    with launch.run_server(protocol.TINY_RANDOM, port=0, batching="continuous", prefix_cache_tokens=4096) as a, \
            launch.run_server(protocol.TINY_RANDOM, port=0, batching="continuous", prefix_cache_tokens=4096) as b:
        rows = nb13_runs.replay_rounds({"clean": clean, "timestamp": busted}, {"clean": a.url, "timestamp": b.url},
                                       max_tokens=2, flush={a.url: a.flush_cache, b.url: b.flush_cache})
        alone = nb13_runs.replay(a.url, clean, max_tokens=2) if a.flush_cache() >= 0 else None
    assert [(r["session"], r["turn"], r["round"]) for r in rows["clean"]] == [
        (s, t, k) for k, (s, t) in enumerate(nb13_runs.order(clean))]
    assert [r["cached_tokens"] for r in rows["clean"]] == [r["cached_tokens"] for r in alone], "as one replay"
    assert rows["clean"][0]["cached_tokens"] == 0, "the warm-up was flushed"
    assert sum(r["cached_tokens"] or 0 for r in rows["timestamp"][2:]) > 0, "its own turn 0 still serves turn 1"
    _, judged = nb13_runs.busted_against_clean(rows)
    assert judged.paired and judged.n == 2
    with pytest.raises(ValueError, match="same sessions and turns"):
        nb13_runs.replay_rounds({"clean": clean, "timestamp": busted[:1]}, {"clean": "u", "timestamp": "v"})


def test_the_busted_sentence_says_how_it_was_judged():
    from labkit.core import verdict
    from labkit.lessons.nb13 import findings as nb13

    clean, busted = {"cached_share": 0.9}, {"cached_share": 0.1}
    drift = [1.0, 1.3, 0.8, 1.2, 0.9, 1.1, 1.25, 0.85]
    paired = verdict.compare([3e-3 * d for d in drift], [1e-3 * d for d in drift], paired=True, higher_is_better=False)
    said = nb13.busted_sentence("Here", clean, busted, paired)
    assert "the same request's TTFT per prompt token with the timestamp was 3.00× the clean run's (the geometric mean " \
           "of 8 requests paired round by round; slower: paired sign-flip test, 8 pairs" in said
    few = verdict.compare([3e-3, 3.1e-3], [1e-3, 1.1e-3], paired=True, higher_is_better=False)
    assert "slower" not in nb13.busted_sentence("Here", clean, busted, few), "2 pairs: no verdict, whatever the gap"
    once = verdict.compare([3e-3, 3.1e-3, 2.9e-3], [1e-3, 1.1e-3, 0.9e-3], higher_is_better=False)
    assert "(slower, judged unpaired: " in nb13.busted_sentence("Here", clean, busted, once)
    rows = nb13.takeaways(clean=clean, busted=busted, judged=paired, sentences=[], crossover=None,
                          resident={"budget_tokens": 1, "predicted": 1, "measured": 1, "runs": "x"}, tool_rows=None).rows
    assert rows[2]["finding"] == "TTFT per prompt token, timestamped ÷ clean (geometric mean of the pairs)"


def test_a_tier_with_too_few_pairs_says_so_and_what_full_mode_runs():
    from labkit.core import results
    from labkit.lessons.nb13 import findings as nb13
    from labkit.lessons.nb13 import runs as nb13_runs

    rows = [{"tokens": n, "way": w, "round": r, "ttft_s": t * (1 + 0.01 * r), "cached_tokens": 0, "answer": []}
            for r in range(1) for n, w, t in ((128, "reload", 0.3), (128, "recompute", 0.2))]
    table = nb13_runs.tier_table(rows)
    said = nb13.tier_beside_reference(table, 8)
    assert said == ("Too few pairs here for the paired test (128 tokens: no verdict (1 pair)); full mode runs 8 rounds "
                    "of each way, and no full-mode reference of this notebook ships yet to show its verdicts.")
    ref = results.Results("13_agents", env={"date": "2026-12-09T10:00:00+00:00"})
    ref.replace("tier", [{"tokens": 128, "reload_over_recompute": 1.4, "reload_verdict": "worse"}])
    assert nb13.tier_beside_reference(table, 8, ref).endswith(
        "the full-mode reference (recorded 2026-12-09): 128 tokens: reload 1.40× recompute (worse).")
    six = nb13_runs.tier_table([dict(r, round=k, ttft_s=r["ttft_s"] * (1 + k / 10)) for k in range(6) for r in rows])
    assert six[0]["pairs"] == 6 and nb13.tier_beside_reference(six, 8) == ""
