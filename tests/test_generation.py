"""labkit.decoding.generation: timing metrics from token stamps, their aggregate, and generate and measure_decode
on a tiny model (every token timed, batches counted, bad token counts refused)."""
from __future__ import annotations

import pytest

from labkit.decoding import generation
from labkit.decoding.generation import GenerationResult


def test_metrics_from_hand_made_stamps():
    # call at t=10; tokens at 10.5, 10.6, 10.8, 11.1
    r = GenerationResult.from_stamps(10.0, [10.5, 10.6, 10.8, 11.1], n_prompt=7)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.e2e_s == pytest.approx(1.1)
    assert r.itl_s == pytest.approx([0.1, 0.2, 0.3])
    assert r.tpot_s == pytest.approx((1.1 - 0.5) / 3)  # vLLM's definition
    assert r.output_tokens_per_s == pytest.approx(4 / 1.1)
    single = GenerationResult.from_stamps(0.0, [0.2], n_prompt=3)
    assert single.tpot_s is None and single.decode_tokens_per_s is None
    with pytest.raises(ValueError, match="no tokens"):
        GenerationResult.from_stamps(0.0, [], n_prompt=3)


def test_aggregate():
    rs = [GenerationResult.from_stamps(0.0, [0.1, 0.2, 0.3], 5), GenerationResult.from_stamps(0.0, [0.3, 0.5], 5)]
    agg = generation.aggregate(rs)
    assert agg["n"] == 2 and agg["output_tokens"] == 5
    assert agg["ttft_s"]["median"] == pytest.approx(0.2)
    assert agg["output_tokens_per_s"] == pytest.approx(5 / 0.8)


def test_generate_times_every_token(tiny_llama):
    model, tok = tiny_llama
    r = generation.generate(model, tok, "Hello there", max_new_tokens=12, fixed_length=True)
    assert r.n_out == 12 and len(r.itl_s) == 11
    assert 0 < r.ttft_s <= r.e2e_s
    assert r.e2e_s == pytest.approx(r.ttft_s + sum(r.itl_s))


def test_generate_batch_counts_tokens_per_sequence(tiny_llama):
    model, tok = tiny_llama
    r = generation.generate(model, tok, ["short", "a much longer prompt than the other one"], max_new_tokens=5,
                            fixed_length=True)
    assert r.batch == 2 and r.n_out == 5
    assert r.output_tokens_per_s == pytest.approx(10 / r.e2e_s)


@pytest.mark.parametrize("bad", [0, -4, 2.5, True])
def test_generate_rejects_bad_token_counts(tiny_llama, bad):
    model, tok = tiny_llama
    with pytest.raises(ValueError, match="max_new_tokens"):
        generation.generate(model, tok, "hi", max_new_tokens=bad)


def test_measure_decode_validates(tiny_llama):
    model, tok = tiny_llama
    with pytest.raises(ValueError, match="batch"):
        generation.measure_decode(model, tok, batch=0)
    d = generation.measure_decode(model, tok, batch=2, new_tokens=6, repeats=2)
    assert d["aggregate_tokens_per_s"] == pytest.approx(2 * d["decode_tokens_per_s"])
    assert d["tpot"].n == 2


def test_decode_variants_times_models_in_rounds_and_keeps_every_sample(tiny_llama, monkeypatch):
    model, tok = tiny_llama
    seen = []
    real = generation.generate

    def spy(m, t, prompt, max_new_tokens, **kw):
        seen.append((m.tag, max_new_tokens))
        return real(m, t, prompt, max_new_tokens=max_new_tokens, **kw)

    class Tagged:  # the same model under two names: which one generate() was handed
        def __init__(self, tag):
            self.tag = tag

        def __getattr__(self, name):
            return getattr(model, name)

    monkeypatch.setattr(generation, "generate", spy)
    rows = generation.decode_variants({"a": (Tagged("a"), tok), "b": (Tagged("b"), tok)}, new_tokens=10, rounds=3)
    assert seen[:2] == [("a", 8), ("b", 8)]  # one short warmup each
    timed = [tag for tag, n in seen[2:]]
    # three rounds, each with a and b once in a shuffled order, then the baseline again after the last round
    assert [sorted(timed[i:i + 2]) for i in (0, 2, 4)] == [["a", "b"]] * 3 and timed[6:] == ["a"]
    assert len(rows["a"]["samples"]["decode_tokens_per_s"]) == rows["b"]["n"] == 3  # the extra pass is not a round
    assert rows["a"]["drift"] == rows["b"]["drift"] and rows["a"]["drift"] > 0
    with pytest.raises(ValueError, match="rounds"):
        generation.decode_variants({"a": (model, tok)}, rounds=0)
