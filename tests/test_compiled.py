"""labkit.engines.compiled: the static-cache decoder, eager and compiled, gives the reference's greedy tokens;
its measurements and eager operator count."""
from __future__ import annotations

import pytest

from labkit.core import env
from labkit.decoding import quality
from labkit.engines import compiled
from labkit.model import models


def _prompt(tok, text="Write a haiku about a cup of coffee."):
    return models.chat_inputs(tok, text)["input_ids"]


def _greedy(model, ids, n):
    import torch

    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_static_decoder_matches_generate_and_reference(tiny_llama):
    model, tok = tiny_llama
    ids = _prompt(tok)
    dec = compiled.StaticDecoder(model, max_cache_len=96)
    timing, tokens, _ = dec.generate(ids, 8)
    assert tokens == _greedy(model, ids, 8)
    assert timing.n_out == 8 and 0 < timing.ttft_s <= timing.e2e_s and timing.n_prompt == ids.shape[1]
    again, tokens2, _ = dec.generate(ids, 8)  # the cache is reset between runs
    assert tokens2 == tokens
    ref = quality.reference(model, tok, ["Hi there", "Name a colour."], new_tokens=6)
    q = compiled.decoder_quality(dec, ref)
    assert q.agreement == 1.0 and q.kl < 1e-6 and q.n_tokens == 12
    with pytest.raises(ValueError, match="max_cache_len"):
        dec.generate(ids, 200)
    with pytest.raises(ValueError, match="max_cache_len"):
        compiled.StaticDecoder(model, max_cache_len=1)


def test_measure_decoder_and_eager_op_count(tiny_llama):
    model, tok = tiny_llama
    ids = _prompt(tok)
    m = compiled.measure_decoder(compiled.StaticDecoder(model, max_cache_len=96), ids, new_tokens=6, repeats=2)
    assert m["decode_tokens_per_s"] > 0 and m["repeats"] == 2 and m["build_s"] is None and len(m["tokens"]) == 6
    n_ops = compiled.count_eager_ops(model, ids)
    assert n_ops > 20 * model.config.num_hidden_layers  # dozens of operators per layer per token
    with pytest.raises(ValueError, match="at least 2"):
        compiled.measure_decoder(compiled.StaticDecoder(model, max_cache_len=96), ids, new_tokens=1)


def test_measure_decoders_times_them_in_shuffled_rounds_that_pair_up(tiny_llama, monkeypatch):
    from labkit.core import timing, verdict

    model, tok = tiny_llama
    ids = _prompt(tok)
    seen = []
    real = timing.rounds
    monkeypatch.setattr(timing, "rounds", lambda calls, n, **kw: seen.append(real(calls, n, **kw)) or seen[-1])
    decs = {"a": compiled.StaticDecoder(model, max_cache_len=96), "b": compiled.StaticDecoder(model, max_cache_len=96)}
    out = compiled.measure_decoders(decs, ids, new_tokens=4, rounds=6)
    (done,) = seen
    assert done.again is None and len(set(done.order)) == 2, "no extra pass; both orders run"
    for name in decs:
        rates = out[name]["samples"]["decode_tokens_per_s"]
        assert len(rates) == 6 and out[name]["rounds_paired"] and out[name]["tokens"] == out["a"]["tokens"]
        assert rates == [1 / r.tpot_s for r, _, _ in done[name]], "round i at index i"
    v = verdict.compare(out["b"]["samples"]["decode_tokens_per_s"], out["a"]["samples"]["decode_tokens_per_s"],
                        paired=True)
    assert v.paired and v.n == 6
    with pytest.raises(ValueError, match="rounds"):
        compiled.measure_decoders(decs, ids, new_tokens=4, rounds=0)


def test_compiled_decoder_gives_eager_tokens(tiny_llama):
    """torch.compile of the decode step (inductor, CPU): same greedy tokens, kernels counted, build timed."""
    if not env.capability("torch.compile").available:
        pytest.skip(env.capability("torch.compile").reason)
    model, tok = tiny_llama
    ids = _prompt(tok)
    eager = compiled.StaticDecoder(model, max_cache_len=64).generate(ids, 6)[1]
    dec = compiled.StaticDecoder(model, max_cache_len=64, compile=True, fresh_cache=False)
    _, tokens, _ = dec.generate(ids, 6)
    assert tokens == eager
    assert dec.build_s is not None and dec.build_s > 0
    _, tokens_b, _ = dec.generate(_prompt(tok, "Name a colour."), 6)  # another prompt: no rebuild needed
    assert tokens_b == compiled.StaticDecoder(model, max_cache_len=64).generate(_prompt(tok, "Name a colour."), 6)[1]


def test_one_operator_count_for_one_decode_step_in_01_08_10(tiny_llama):
    from pathlib import Path

    from labkit.engines import fusion

    model, tok = tiny_llama
    ids = _prompt(tok)
    ops = fusion.decode_step_ops(model, ids)
    assert compiled.count_eager_ops(model, ids) == len(ops)
    assert ops.count("linear") + ops.count("addmm") + ops.count("mm") >= 7 * model.config.num_hidden_layers
    assert "dynamic cache" in fusion.STEP_OPS_COUNTED
    src = Path(__file__).parents[1] / "notebooks" / "src"
    for nb in ("01_hardware_sizing.py", "08_tensorrt.py", "10_beyond.py"):
        text = (src / nb).read_text()
        assert "STEP_OPS_COUNTED" in text and ("decode_step_ops(" in text or "count_eager_ops(" in text), nb
        assert "eager_ops(decode." not in text, f"{nb} counts a decode step its own way"
