"""labkit.serve.experiments.scheduler: static and continuous batching complete every request with the tokens it
gets alone."""
from __future__ import annotations

import pytest

from labkit.model import models, prompts
from labkit.serve import continuous, decoder, launch, loadgen
from labkit.serve.experiments import scheduler

TEXTS = ["Hi", "Explain in two sentences why the sky is blue, please, in detail.", "What is 12 times 12?",
         "Name a colour.", "Write a haiku about a cup of coffee.", "Count to three."]
LIMITS = [3, 11, 2, 7, 9, 1]  # mixed answer lengths: requests finish at different steps


def _requests(tok, texts=TEXTS, limits=LIMITS):
    return [scheduler.Request(id=f"q{i}", prompt_ids=models.chat_ids(tok, t), max_new_tokens=n,
                              kind="long" if n > 5 else "short") for i, (t, n) in enumerate(zip(texts, limits))]


def _alone(model, tok, reqs, eos):
    """Each request by itself through transformers' generate (greedy), cut at the first end-of-sequence token."""
    import torch

    out = {}
    with torch.inference_mode():
        for r in reqs:
            ids = torch.tensor([r.prompt_ids])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_new_tokens,
                                 do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
            stop = next((i for i, t in enumerate(gen) if t in eos), None)
            out[r.id] = gen if stop is None else gen[: stop + 1]
    return out


@pytest.fixture(scope="module")
def alone(tiny_llama):
    model, tok = tiny_llama
    return _alone(model, tok, _requests(tok), decoder.eos_ids(model, tok))


@pytest.mark.parametrize("batch", [1, 3])
def test_static_and_continuous_match_each_request_alone(tiny_llama, alone, batch):
    model, tok = tiny_llama
    reqs = _requests(tok)
    eos = decoder.eos_ids(model, tok)
    for mode in scheduler.MODES:
        run = scheduler.run(model, reqs, eos, tok.pad_token_id, mode, batch)
        assert run.outputs() == alone, mode
        assert all(c.finish_reason in ("stop", "length") and c.finished_s is not None for c in run.completions)
        assert all(c.first_token_s <= c.last_token_s <= c.finished_s for c in run.completions)
        assert run.output_tokens == sum(len(v) for v in alone.values())


def test_eos_stops_a_request_early(tiny_llama):
    model, tok = tiny_llama
    reqs = _requests(tok)
    probe = scheduler.run_continuous(model, reqs, set(), tok.pad_token_id, max_batch_size=3)
    stop_token = probe.completions[1].tokens[2]  # declare request 1's third token an end-of-sequence token
    run = scheduler.run_continuous(model, reqs, {stop_token}, tok.pad_token_id, max_batch_size=3)
    c = run.completions[1]
    assert c.finish_reason == "stop" and c.tokens[-1] == stop_token and len(c.tokens) <= 3
    assert run.outputs() == _alone(model, tok, reqs, {stop_token})


def test_continuous_computes_no_finished_rows_and_fewer_steps(tiny_llama):
    model, tok = tiny_llama
    reqs = _requests(tok)
    static = scheduler.run_static(model, reqs, set(), tok.pad_token_id, batch_size=3)
    cont = scheduler.run_continuous(model, reqs, set(), tok.pad_token_id, max_batch_size=3)
    # static: batches (3, 11, 2) and (7, 9, 1) run 10 + 8 decode steps of 3 rows each
    assert static.decode_steps == 18 and static.computed_rows == 54 and static.prefills == 2
    assert cont.prefills == len(reqs) and cont.computed_rows == sum(LIMITS) - len(reqs)
    assert cont.summary()["wasted_row_fraction"] == 0 and static.summary()["wasted_row_fraction"] > 0.4
    assert cont.decode_steps < static.decode_steps
    # static hands a batch back at once; continuous as each request finishes
    first_batch = static.completions[:3]
    assert len({c.finished_s for c in first_batch}) == 1
    assert cont.completions[2].finished_s < cont.completions[1].finished_s


def test_join_and_trim_caches():
    import torch
    from transformers import DynamicCache

    a, b = DynamicCache(), DynamicCache()
    a.update(torch.ones(2, 1, 3, 4), torch.ones(2, 1, 3, 4), 0)
    b.update(torch.full((1, 1, 5, 4), 2.0), torch.full((1, 1, 5, 4), 2.0), 0)
    mask = continuous.join_caches(a, torch.ones(2, 3, dtype=torch.long), b, torch.ones(1, 5, dtype=torch.long))
    assert mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    keys = a.layers[0].keys
    assert keys.shape == (3, 1, 5, 4) and keys[0, 0, :2].abs().sum() == 0 and keys[2].eq(2).all()
    a.batch_select_indices(torch.tensor([0, 1]))  # the long row leaves: two all-padding columns remain
    trimmed = continuous.trim_left(a, mask[:2])
    assert trimmed.tolist() == [[1, 1, 1], [1, 1, 1]] and a.layers[0].keys.shape == (2, 1, 3, 4)


def test_bad_input(tiny_llama):
    model, tok = tiny_llama
    with pytest.raises(ValueError, match="no requests"):
        scheduler.run_continuous(model, [], set(), 0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        scheduler.Request(id="x", prompt_ids=(1,), max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt token"):
        scheduler.Request(id="x", prompt_ids=(), max_new_tokens=1)
    r = scheduler.Request(id="x", prompt_ids=(1, 2), max_new_tokens=1)
    with pytest.raises(ValueError, match="unique"):
        scheduler.run_static(model, [r, r], set(), 0)
    with pytest.raises(ValueError, match="choose one of"):
        scheduler.run(model, [r], set(), 0, "paged")
    with pytest.raises(ValueError, match="batch_size"):
        scheduler.run_static(model, [r], set(), 0, batch_size=0)


def test_mixed_workload_from_the_requests_file(tiny_llama):
    _, tok = tiny_llama
    reqs = scheduler.mixed_workload(tok, n_requests=8, long_every=4, short_tokens=8, long_tokens=40)
    assert [r.kind for r in reqs] == ["long", "short", "short", "short"] * 2
    assert all(r.max_new_tokens <= 8 for r in reqs if r.kind == "short")
    assert min(r.max_new_tokens for r in reqs if r.kind == "long") > max(r.max_new_tokens for r in reqs if r.kind == "short")
    with pytest.raises(ValueError, match="holds only"):
        scheduler.mixed_workload(tok, n_requests=500)


def test_continuous_server_answers_every_request():
    with launch.run_server("tiny-random", batching="continuous", port=0, max_batch_size=3) as srv:
        res = loadgen.run(srv.url, num_requests=12, max_concurrency=5, max_tokens=6, warmup=1)
        bad = loadgen.run(srv.url, num_requests=1, max_tokens=10**6, warmup=0).outputs[0]
        stats = srv.stats()
    s = res.summary()
    assert s["completed"] == 12 and s["failed"] == 0 and s["output_tokens"] == 12 * 6
    assert bad.status == 400
    assert 1 < stats["mean_batch_size"] <= 3  # requests really ran together, never more than the limit


def test_transformers_continuous_batching_check():
    status = scheduler.hf_continuous_batching()
    assert set(status) >= {"available", "reason", "device"}
    assert status["available"] or status["device"] in status["reason"]


@pytest.mark.slow
def test_default_model_continuous_matches_alone(default_lm):
    model, tok = default_lm.model, default_lm.tokenizer
    texts = prompts.load_prompts("questions")[:2] + prompts.load_prompts("prompts")[:2]
    reqs = _requests(tok, texts, [12, 4, 16, 6])
    eos = decoder.eos_ids(model, tok)
    run = scheduler.run_continuous(model, reqs, eos, tok.pad_token_id, max_batch_size=3)
    assert run.outputs() == _alone(model, tok, reqs, eos)


def test_rounds_interleave_modes_and_run_the_first_again_last():
    from labkit.serve.experiments import scheduler as sched

    order = []
    done = sched.rounds({m: (lambda m=m: order.append(m) or m) for m in ("alone", "static", "continuous")}, 2)
    assert sorted(order[:3]) == sorted(order[3:6]) == ["alone", "continuous", "static"] and order[6] == "alone"
    assert [tuple(order[:3]), tuple(order[3:6])] == done.order, "each round in a shuffled order, kept"
    assert {m: len(v) for m, v in done.items()} == {"alone": 2, "static": 2, "continuous": 2}, "the extra pass is no round"
    assert done.again == "alone"
