"""Prefix caching and chunked prefill in the continuous-batching engine and server: the same tokens as
without them, less prefill, and the counters /metrics reports."""
from __future__ import annotations

import json

import pytest
import torch

from labkit.model import models
from labkit.serve import continuous, decoder, launch, protocol, scheduler
from test_scheduler import _alone
from test_server import request

SYSTEM = ("You are a careful assistant for a workshop on inference. Answer in one short sentence, "
          "plainly, and never invent numbers you did not measure.")
QUESTIONS = ["What is a KV cache?", "Why batch requests?", "What does a GPU do best?", "Define latency.", "Hi"]


def _shared_prefix_requests(tok, limits=(5, 3, 6, 2, 4)):
    return [scheduler.Request(id=f"s{i}", prompt_ids=models.chat_ids(tok, f"{SYSTEM}\n\n{q}"), max_new_tokens=n)
            for i, (q, n) in enumerate(zip(QUESTIONS, limits))]


def test_prefix_cache_lookup_store_and_eviction():
    pc = continuous.PrefixCache(capacity_tokens=64, block_tokens=8)
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
        continuous.PrefixCache(0)


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
    pc = continuous.PrefixCache(capacity_tokens=512, block_tokens=8)
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
