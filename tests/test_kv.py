import pytest
import torch

from labkit import kv, profiling, sizing
from labkit.generation import GenerationResult


def test_cache_bytes_match_the_formula_on_a_tiny_model(tiny_llama):
    model, tok = tiny_llama
    for batch in (1, 3):
        size = kv.measure_cache(model, tok, "Hello there", new_tokens=5, batch=batch)
        s = sizing.shape(model.config)
        per_position = 2 * s.n_layers * s.n_kv_heads * s.head_dim * 4  # K and V, fp32
        assert size.measured_bytes == per_position * size.context * batch
        assert size.positions == size.context
        assert size.predicted_bytes == sizing.kv_bytes(s, "fp32", size.context, batch)
        assert size.ratio == 1.0


def test_prefill_cache_grows_linearly(tiny_llama):
    model, tok = tiny_llama
    rows = kv.prefill_cache_sizes(model, tok, [8, 16, 64], batch=2)
    assert [r.context for r in rows] == [8, 16, 64] == [r.positions for r in rows]
    assert rows[2].measured_bytes == 8 * rows[0].measured_bytes
    assert all(r.measured_bytes == r.predicted_bytes for r in rows)


def test_cache_layers_reads_legacy_tuples_and_rejects_none():
    k = torch.zeros(1, 2, 5, 4)
    assert kv.cache_bytes(((k, k), (k, k))) == 4 * k.numel() * 4
    assert kv.cache_positions(((k, k),)) == 5
    with pytest.raises(ValueError, match="use_cache=False"):
        kv.cache_bytes(None)


@pytest.mark.slow
def test_default_model_cache_matches_sizing(default_lm):
    size = kv.measure_cache(default_lm.model, default_lm.tokenizer, new_tokens=4, batch=2)
    assert size.cache_class == "DynamicCache"
    assert size.measured_bytes == pytest.approx(size.predicted_bytes, rel=0.05)
    # SmolLM2-135M: 30 layers × 3 KV heads × 64 dims × K and V × 4 bytes per position
    assert size.measured_bytes == 30 * 3 * 64 * 2 * 4 * size.context * 2


def test_prompt_of_length_is_exact(tiny_llama):
    _, tok = tiny_llama
    for n in (1, 37, 700):
        inputs = kv.prompt_of_length(tok, n, batch=2)
        assert inputs["input_ids"].shape == (2, n) and int(inputs["attention_mask"].sum()) == 2 * n
    with pytest.raises(ValueError, match="n_tokens"):
        kv.prompt_of_length(tok, 0)


def test_cache_off_gives_the_same_tokens(tiny_llama):
    model, tok = tiny_llama
    on = kv.timed_generate(model, tok, "Tell me a story", new_tokens=6, use_cache=True)
    off = kv.timed_generate(model, tok, "Tell me a story", new_tokens=6, use_cache=False)
    assert on.n_out == off.n_out == 6 and on.text == off.text


def test_static_cache_holds_the_same_positions(tiny_llama):
    model, tok = tiny_llama
    dyn = kv.measure_cache(model, tok, "Hi", new_tokens=4)
    static = kv.measure_cache(model, tok, "Hi", new_tokens=4, **kv.cache_variant_kwargs("static"))
    assert static.cache_class == "StaticCache" and static.measured_bytes == dyn.measured_bytes


def test_per_token_rows_and_elapsed_at():
    r = GenerationResult.from_stamps(0.0, [0.5, 0.6, 0.8, 1.1], n_prompt=10)
    rows = kv.per_token_rows(r, "on")
    assert [x["token"] for x in rows] == [1, 2, 3, 4]
    assert [x["position"] for x in rows] == [10, 11, 12, 13]
    assert [x["itl_s"] for x in rows] == pytest.approx([0.5, 0.1, 0.2, 0.3])
    assert kv.elapsed_at(r, [1, 4]) == pytest.approx({1: 0.5, 4: 1.1})
    with pytest.raises(ValueError, match="within 1..4"):
        kv.elapsed_at(r, [5])


def test_bad_choices_are_named():
    with pytest.raises(ValueError, match="dynamic"):
        kv.cache_variant_kwargs("paged")
    with pytest.raises(ValueError, match="sdpa"):
        kv.compare_attention(None, None, ["flash"])


def test_attention_status_says_why_not():
    rows = {r["attn_implementation"]: r for r in kv.attention_status("cpu")}
    assert rows["eager"]["available"] and rows["sdpa"]["available"]
    assert not rows["flash_attention_2"]["available"] and "CUDA" in rows["flash_attention_2"]["reason"]


def test_compare_attention_restores_the_implementation(tiny_llama):
    model, tok = tiny_llama
    before = model.config._attn_implementation
    rows = kv.compare_attention(model, tok, ["eager", "sdpa"], prompt_tokens=16, new_tokens=3, repeats=1)
    assert [r["attn_implementation"] for r in rows] == ["eager", "sdpa"]
    assert rows[0]["answer_start"] == rows[1]["answer_start"]  # same greedy tokens either way
    assert model.config._attn_implementation == before


@pytest.mark.parametrize("name, group", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::linear", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"), ("aten::bmm", "attention"),
    ("aten::_softmax", "attention"), ("aten::mul", "other"), ("aten::cat", "other"),
])
def test_op_groups(name, group):
    assert profiling.op_group(name) == group


def test_profile_prefill_and_decode(tiny_llama):
    model, tok = tiny_llama
    profiles = profiling.profile_prefill_decode(model, tok, prompt_tokens=16)
    assert [p.step for p in profiles] == ["prefill (16 tokens)", "decode (1 token)"]
    groups = profiling.groups_frame(profiles)
    for step, df in groups.groupby("step"):
        assert list(df["group"]) == list(profiling.GROUPS)
        assert df["share"].sum() == pytest.approx(1.0)
        assert float(df.loc[df["group"] == "matmul", "self_us"].iloc[0]) > 0
    top = profiling.top_ops_frame(profiles, top=3)
    assert len(top) == 6 and (top["self_us"] > 0).all()
    assert profiling.groups_figure(profiles).data
