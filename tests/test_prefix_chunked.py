"""Prefix caching and chunked prefill in the continuous-batching engine and server: the same tokens as
without them, less prefill, and the counters /metrics reports."""
from __future__ import annotations

import json

import pytest
import torch

from labkit.model import models
from labkit.serve import continuous, decoder, launch, prefix_cache, protocol
from labkit.serve.experiments import scheduler
from test_scheduler import _alone
from test_server import request

SYSTEM = ("You are a careful assistant for a workshop on inference. Answer in one short sentence, "
          "plainly, and never invent numbers you did not measure.")
QUESTIONS = ["What is a KV cache?", "Why batch requests?", "What does a GPU do best?", "Define latency.", "Hi"]


def _shared_prefix_requests(tok, limits=(5, 3, 6, 2, 4)):
    return [scheduler.Request(id=f"s{i}", prompt_ids=models.chat_ids(tok, f"{SYSTEM}\n\n{q}"), max_new_tokens=n)
            for i, (q, n) in enumerate(zip(QUESTIONS, limits))]


def test_prefix_cache_lookup_store_and_eviction():
    pc = prefix_cache.PrefixCache(capacity_tokens=64, block_tokens=8)
    cache = _fake_cache(40)
    pc.store(list(range(40)), cache)  # keeps the first 40 positions (5 blocks)
    reused, got = pc.lookup(list(range(20)) + [99, 98, 97])
    assert reused == 16 and got.get_seq_length() == 16  # 20 shared tokens, aligned down to 16
    assert torch.equal(got.layers[0].keys, cache.layers[0].keys[:, :, :16])
    assert pc.lookup(list(range(40)))[0] == 32, "one prompt token is always left to prefill"
    assert pc.lookup([7, 7, 7])[0] == 0
    pc.store(list(range(100, 140)), _fake_cache(40))  # 80 positions > 64: the older entry is evicted
    assert pc.tokens == 40 and pc.evictions == 1 and pc.lookup(list(range(40)))[0] == 0
    s = pc.stats()
    assert (s["queries"], s["hits"]) == (4, 2)
    with pytest.raises(ValueError, match="capacity_tokens"):
        prefix_cache.PrefixCache(0)


def _fake_cache(n):
    from transformers import DynamicCache

    cache = DynamicCache()
    for i in range(2):
        cache.update(torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4), i)
    return cache


def test_prefix_cache_and_chunked_prefill_keep_every_token(tiny_llama):
    model, tok = tiny_llama
    reqs = _shared_prefix_requests(tok)
    eos = decoder.eos_ids(model, tok)
    alone = _alone(model, tok, reqs, eos)
    plain = scheduler.run_continuous(model, reqs, eos, tok.pad_token_id, max_batch_size=2)
    pc = prefix_cache.PrefixCache(capacity_tokens=512, block_tokens=8)
    cached = scheduler.run_continuous(model, reqs, eos, tok.pad_token_id, max_batch_size=2, prefix_cache=pc)
    chunked = scheduler.run_continuous(model, reqs, eos, tok.pad_token_id, max_batch_size=2, prefill_chunk_tokens=7)
    assert plain.outputs() == cached.outputs() == chunked.outputs() == alone
    a, b = reqs[0].prompt_ids, reqs[1].prompt_ids
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)  # the chat header + the shared text
    assert common > 40
    assert pc.hits == len(reqs) - 1 and pc.hit_tokens == (len(reqs) - 1) * (common // 8 * 8)
    assert chunked.prefills == len(reqs)


def test_chunked_prefill_runs_decode_steps_between_chunks(tiny_llama):
    model, tok = tiny_llama
    eos = set()
    engine = continuous.ContinuousEngine(model, eos, tok.pad_token_id, prefill_chunk_tokens=8)
    short = decoder.Sequence(prompt_ids=[5, 6, 7], max_new_tokens=50)
    long_ = decoder.Sequence(prompt_ids=list(range(10, 50)), max_new_tokens=3)
    engine.admit(short)
    engine.step()  # the short prompt fits one chunk: it runs from here on
    engine.admit(long_)
    steps = 0
    while long_ not in engine.active and not long_.tokens:
        before = len(short.tokens)
        engine.step()
        steps += 1
        assert len(short.tokens) == before + 1, "a running stream got a token at every step"
    assert steps == 5 and engine.prefill_chunks == 1 + 5  # 40 prompt tokens in chunks of 8


def test_prefix_options_need_continuous_batching():
    with pytest.raises(ValueError, match="batching='continuous'"):
        protocol.ServerConfig(prefix_cache_tokens=256).check()
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        protocol.ServerConfig(batching="continuous", prefill_chunk_tokens=-1).check()


def test_server_with_prefix_cache_answers_the_same_and_reports_hits():
    body = lambda q: {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],  # noqa: E731
                      "max_tokens": 5, "ignore_eos": True}
    answers = {}
    for options in ({}, {"prefix_cache_tokens": 1024}, {"prefill_chunk_tokens": 16}):
        with launch.run_server(protocol.TINY_RANDOM, port=0, batching="continuous", **options) as srv:
            outs = [json.loads(request(srv.url + "/v1/chat/completions", body(q))[2]) for q in QUESTIONS[:3]]
            got = [o["choices"][0]["message"]["content"] for o in outs]
            cached = [o["usage"]["prompt_tokens_details"]["cached_tokens"] for o in outs]  # the usage says what was reused
            answers[tuple(options)] = got
            metrics = request(srv.url + "/metrics", method="GET")[2]
        if options.get("prefix_cache_tokens"):
            hits = float(next(l for l in metrics.splitlines() if l.startswith("labkit_prefix_cache_hits_total ")).split()[1])
            assert hits == 2
            reused = float(next(l for l in metrics.splitlines()
                                if l.startswith("labkit_prefix_cache_hit_tokens_total ")).split()[1])
            assert [c for c in cached[1:]] and sum(cached) == reused and cached[0] == 0 and all(c > 0 for c in cached[1:])
        else:
            assert cached == [0, 0, 0], "no prefix cache: nothing served from one"
    assert len(set(map(tuple, answers.values()))) == 1, answers


# ------------------------------------------------------------------------------------------------ the disk tier


def test_an_evicted_entry_goes_to_disk_and_comes_back_whole(tmp_path):
    pc = prefix_cache.PrefixCache(capacity_tokens=48, block_tokens=8, disk_dir=tmp_path)
    first = _fake_cache(40)
    pc.store(list(range(40)), first)
    pc.store(list(range(100, 140)), _fake_cache(40))  # 80 positions > 48: the first entry is evicted, to disk
    assert pc.evictions == 1 and pc.disk_writes == 1 and len(list(tmp_path.glob("*.safetensors"))) == 1
    reused, got = pc.lookup(list(range(40)) + [7])
    assert reused == 40 and pc.disk_hits == 1 and pc.stats()["disk_entries"] == 1, "the other entry went to disk"
    for i in range(2):  # the same KV, on the device it left
        assert torch.equal(got.layers[i].keys, first.layers[i].keys) and got.layers[i].keys.device.type == "cpu"
        assert torch.equal(got.layers[i].values, first.layers[i].values)
    assert pc.clear() == 2 and not list(tmp_path.glob("*.safetensors")), "a flush empties both tiers"


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_disk_file_gone_or_cut_short_is_recomputed_never_answered(tmp_path, damage):
    pc = prefix_cache.PrefixCache(capacity_tokens=48, block_tokens=8, disk_dir=tmp_path)
    pc.store(list(range(40)), _fake_cache(40))
    pc.store(list(range(100, 140)), _fake_cache(40))
    path = next(tmp_path.glob("*.safetensors"))
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert pc.lookup(list(range(40)) + [7]) == (0, None), "a miss: the prompt is prefilled again"
    assert pc.disk_failures == 1 and pc.disk_hits == 0 and pc.stats()["disk_entries"] == 0


def test_the_spill_policy_decides_what_goes_to_disk(tmp_path):
    pc = prefix_cache.PrefixCache(capacity_tokens=48, block_tokens=8, disk_dir=tmp_path, spill=lambda n: n >= 40)
    pc.store(list(range(16)), _fake_cache(16))
    pc.store(list(range(200, 240)), _fake_cache(40))  # evicts the 16-position entry: too short to keep on disk
    assert pc.evictions == 1 and pc.disk_writes == 0
    pc.store(list(range(300, 340)), _fake_cache(40))  # evicts a 40-position one: to disk
    assert pc.disk_writes == 1


def test_a_server_with_a_disk_tier_answers_as_one_without(tmp_path):
    """The lab's server with a prefix cache of 128 positions and a disk tier: two prompts of about 90 tokens take
    turns, each evicting the other to disk, and every answer equals the server's without any cache."""
    long = ["First: " + SYSTEM * 2, "Second, another start: " + SYSTEM * 2]
    body = lambda q: {"messages": [{"role": "user", "content": q}], "max_tokens": 5, "ignore_eos": True}  # noqa: E731
    answers = {}
    for options in ({}, {"prefix_cache_tokens": 128, "prefix_cache_disk_dir": str(tmp_path)}):
        with launch.run_server(protocol.TINY_RANDOM, port=0, batching="continuous", **options) as srv:
            outs = [json.loads(request(srv.url + "/v1/chat/completions", body(q))[2]) for q in long * 2]
            answers[bool(options)] = [o["choices"][0]["message"]["content"] for o in outs]
            metrics = request(srv.url + "/metrics", method="GET")[2]
    assert answers[True] == answers[False]
    read = lambda name: float(next(l for l in metrics.splitlines() if l.startswith(name + " ")).split()[1])  # noqa: E731
    assert read("labkit_prefix_cache_disk_writes_total") >= 1 and read("labkit_prefix_cache_disk_hits_total") >= 1
    with pytest.raises(ValueError, match="second tier"):
        protocol.ServerConfig(batching="continuous", prefix_cache_disk_dir=str(tmp_path)).check()


def test_a_reloaded_entry_goes_back_to_the_device_it_left(tmp_path, monkeypatch):
    """An entry evicted from a GPU is read back onto that GPU, never onto the CPU beside the model's other KV."""
    import safetensors.torch

    pc = prefix_cache.PrefixCache(capacity_tokens=48, block_tokens=8, disk_dir=tmp_path)
    pc.store(list(range(40)), _fake_cache(40))
    pc.store(list(range(100, 140)), _fake_cache(40))
    key = next(iter(pc.on_disk))
    pc.on_disk[key] = (pc.on_disk[key][0], "cuda:1")  # as if it had left the second GPU
    asked = []
    real = safetensors.torch.load_file
    monkeypatch.setattr(safetensors.torch, "load_file", lambda path, device="cpu": asked.append(device) or real(path))
    assert pc.lookup(list(range(40)) + [7])[0] == 40
    assert asked == ["cuda:1"], f"read back onto {asked}, the entry left cuda:1"


def test_token_id_prompts_stream_their_ids_and_the_spill_policy_switches_at_run_time(tmp_path):
    """A completions prompt sent as token ids is served as those ids (usage counts them, the cache reuses them), each
    streamed chunk carries its token id when asked, an id outside the vocabulary is a 400, and ``set_spill`` decides
    while the server runs whether an evicted entry goes to disk."""
    from labkit.lessons.nb13 import runs as nb13_runs
    from labkit.serve import client

    with launch.run_server(protocol.TINY_RANDOM, port=0, batching="continuous", prefix_cache_tokens=64,
                           prefix_cache_disk_dir=str(tmp_path)) as srv:
        a, b = list(range(5, 53)), list(range(60, 108))  # 48 ids each: storing b evicts a
        srv.set_spill(lambda n: False)
        outs, _ = client.send_ids(srv.url, [a, b, a], 4, 1)
        assert [o.prompt_tokens for o in outs] == [48, 48, 48] and all(len(o.token_ids) == 4 for o in outs)
        assert [o.cached_tokens for o in outs] == [0, 0, 0], "a dropped entry is recomputed"
        assert not list(tmp_path.glob("prefix-*")), "the policy said no: nothing was written"
        srv.flush_cache()
        srv.set_spill(None)
        again, _ = client.send_ids(srv.url, [a, b, a], 4, 1)
        assert again[2].cached_tokens == 32 and again[2].token_ids == outs[2].token_ids, "read back from disk, same answer"
        bad = client.post_all(srv.url, [{"prompt": [10**9], "max_tokens": 1}], endpoint="completions")[1][0]
        assert bad["status"] == 400 and "vocabulary" in bad["data"]["error"]["message"]
        too_long = nb13_runs.over_context(srv.url, srv.config.max_prompt_tokens)
        assert too_long["status"] == 400 and "at most" in too_long["message"]
    with launch.run_server(protocol.TINY_RANDOM, port=0, batching="continuous", prefix_cache_tokens=64) as plain:
        with pytest.raises(ValueError, match="no disk tier"):
            plain.set_spill(None)
