from pathlib import Path

import pytest
import torch

from labkit.core import verdict
from labkit.model import prompts, sizing
from labkit.decoding import cache_variants, kv, profiling, quality
from labkit.lessons import findings
from labkit.lessons.nb05 import findings as nb05
from labkit.lessons.nb05 import findings as nb05
from labkit.decoding.generation import GenerationResult


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
        inputs = prompts.prompt_of_length(tok, n, batch=2)
        assert inputs["input_ids"].shape == (2, n) and int(inputs["attention_mask"].sum()) == 2 * n
    with pytest.raises(ValueError, match="n_tokens"):
        prompts.prompt_of_length(tok, 0)


def test_cache_off_gives_the_same_tokens(tiny_llama):
    model, tok = tiny_llama
    on = kv.timed_generate(model, tok, "Tell me a story", new_tokens=6, use_cache=True)
    off = kv.timed_generate(model, tok, "Tell me a story", new_tokens=6, use_cache=False)
    assert on.n_out == off.n_out == 6 and on.text == off.text


def test_static_cache_holds_the_same_positions(tiny_llama):
    model, tok = tiny_llama
    dyn = kv.measure_cache(model, tok, "Hi", new_tokens=4)
    static = kv.measure_cache(model, tok, "Hi", new_tokens=4, **cache_variants.cache_variant_kwargs("static"))
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
        cache_variants.cache_variant_kwargs("paged")
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


# ------------------------------------------------------------- bytes per position, tokens, agreement, claims


def test_bytes_per_position_reads_kv_heads_and_head_dim():
    from transformers import LlamaConfig

    gqa = LlamaConfig(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=5)
    assert kv.bytes_per_position(gqa, 2) == 2 * 5 * 2 * 32 * 2  # K and V × layers × KV heads × head_dim × bytes
    explicit = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
                           head_dim=96)
    assert kv.bytes_per_position(explicit, 4) == 2 * 2 * 4 * 96 * 4  # head_dim from the config, not 256 / 4


def test_bytes_per_position_is_what_a_prefill_stores(tiny_llama):
    model, tok = tiny_llama
    (size,) = kv.prefill_cache_sizes(model, tok, [24])
    assert size.measured_bytes == kv.bytes_per_position(model.config, 4) * 24


def test_token_recorder_sees_the_tokens_generate_returns(tiny_llama):
    model, tok = tiny_llama
    from labkit.model.models import chat_inputs

    inputs = chat_inputs(tok, ["Hello there", "Hi"], device="cpu")  # left padded: rows of different lengths
    recorder = quality.TokenRecorder()
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                             pad_token_id=tok.pad_token_id, **recorder.kwargs())
    assert torch.equal(recorder.tokens, out[:, inputs["input_ids"].shape[1]:])
    with pytest.raises(ValueError, match="no tokens recorded"):
        quality.TokenRecorder().tokens


def test_agreement_counts_equal_positions():
    base = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert quality.agreement(base.clone(), base) == 1.0
    assert quality.agreement(torch.tensor([[1, 2, 0, 0], [5, 6, 7, 8]]), base) == 0.75
    with pytest.raises(ValueError, match="same, non-empty shape"):
        quality.agreement(base[:, :3], base)


def test_time_steps_stamps_each_yielded_token():
    def loop():
        for t in range(4):
            yield torch.tensor([t])

    result, tokens = kv.time_steps(loop(), "cpu", n_prompt=7)
    assert tokens.tolist() == [[0, 1, 2, 3]] and result.n_out == 4 and result.n_prompt == 7
    assert result.ttft_s >= 0 and len(result.itl_s) == 3 and result.e2e_s >= result.ttft_s


def test_cache_variants_and_attention_carry_agreement(tiny_llama):
    model, tok = tiny_llama
    rows = kv.compare_cache_variants(model, tok, ["dynamic", "static"], new_tokens=3, repeats=1)
    assert [(r["baseline"], r["agreement"]) for r in rows] == [("dynamic", 1.0), ("dynamic", 1.0)]
    rows = kv.compare_attention(model, tok, ["sdpa", "eager"], prompt_tokens=12, new_tokens=3, repeats=1)
    assert [r["baseline"] for r in rows] == ["sdpa", "sdpa"] and rows[0]["agreement"] == 1.0


def test_compare_cache_variants_reports_a_changed_answer(tiny_llama, monkeypatch):
    """A variant whose tokens differ from the baseline's gets agreement below 1."""
    model, tok = tiny_llama
    real = kv.timed_generate

    def static_says_otherwise(model_, tok_, prompt, new_tokens, **kw):
        if kw.get("cache_implementation") == "static" and "logits_processor" in kw:
            recorder = kw["logits_processor"][0]
            out = real(model_, tok_, prompt, new_tokens, **kw)
            recorder.steps[-1] = recorder.steps[-1] + 1  # the last token differs
            return out
        return real(model_, tok_, prompt, new_tokens, **kw)

    monkeypatch.setattr(kv, "timed_generate", static_says_otherwise)
    rows = kv.compare_cache_variants(model, tok, ["dynamic", "static"], new_tokens=4, repeats=1)
    assert rows[0]["agreement"] == 1.0 and rows[1]["agreement"] == pytest.approx(0.75)


def test_audit_claims_runs_the_real_calls_and_shows_the_refusals(tiny_llama):
    model, tok = tiny_llama
    before = model.config._attn_implementation
    rows = {r["call"]: r for r in kv.audit_claims(model, tok)}
    flash = rows['generate(..., cache_implementation="flash")']
    assert flash["source"] == "article" and flash["what it does here"].startswith("ValueError")
    assert "static" in flash["what it does here"]  # transformers lists the valid caches
    assert rows['generate(..., cache_implementation="static")']["what it does here"] == "ran: 2 tokens, StaticCache"
    assert rows['model.set_attn_implementation("flash")']["what it does here"].startswith("ValueError")
    assert rows['model.set_attn_implementation("sdpa")']["what it does here"].startswith("ran")
    assert model.config._attn_implementation == before


LOAD6 = (0.98, 1.0, 1.02, 0.99, 1.01, 1.0)  # six rounds' load, shared by every row timed in them
WALK6 = (0.85, 1.15, 0.9, 1.1, 0.95, 1.05)  # a machine drifting ±15 % between rounds
JITTER6 = (1.004, 0.996, 1.0, 1.003, 0.997, 1.0)  # what one pass adds of its own


def _r(x, load=LOAD6, own=None):
    """x in rounds (round i at index i): the round's load times each pass's own jitter, as timing.rounds keeps them."""
    return [x * f * g for f, g in zip(load, own or [1.0] * len(load))]


def _rows(index, key, *samples):
    """Result rows indexed by ``index`` that kept ``samples`` of ``key`` (as kv's timing functions keep them)."""
    import statistics

    import pandas as pd

    return pd.DataFrame({key: [statistics.median(x) for x in samples], "agreement": [1.0, 0.9][:len(samples)],
                         "samples": [{key: list(x)} for x in samples]}, index=index)


def _findings(**over):
    import pandas as pd

    split = _rows([0, 1], "tpot_s", _r(0.050), _r(0.060))
    split["prompt_tokens"], split["ttft_s"], split["new_tokens"] = [32, 512], [0.1, 1.0], [8, 8]
    args = dict(
        loop_agreement=1.0, core_identical=True, tokens=32, speedup=4.0,
        step_growth={"cache on": 1.0, "cache off": 1.8},
        kv_sizes=pd.DataFrame({"measured / formula": [1.0, 1.0]}), bytes_per_position=46080, split=split,
        variants=_rows(["dynamic", "static"], "tpot_s", _r(0.050), _r(0.060)),
        attention=_rows(["eager", "sdpa"], "ttft_s", _r(1.0), _r(0.80)),
        decode_shares={"matmul": [0.70, 0.71, 0.69], "attention": [0.10, 0.11, 0.09], "other": [0.2] * 3},
        weight_bytes=538_000_000)
    args.update(over)
    return nb05.takeaways(**args)


def test_findings_choose_their_words_by_the_verdicts():
    import pandas as pd

    text = " ".join(_findings().sentences)
    assert "4.0× faster" in text and "each step grows with the sequence" in text
    assert "the formula is the cache" in text and "prefill grows with the prompt" in text
    assert "a decode step grew" in text and "the bytes a step reads predict 1.04×" in text
    assert "static cache decoded slower than" in text and "sdpa prefilled the long prompt faster than eager" in text
    assert "matrix multiplication dominates, so a faster matrix-vector kernel" in text and "90% of its tokens equal eager's" in text
    other = " ".join(_findings(speedup=0.8, step_growth={"cache on": 1.0, "cache off": 1.0},
                               kv_sizes=pd.DataFrame({"measured / formula": [1.0, 1.5]}),
                               variants=_rows(["dynamic", "static"], "tpot_s", _r(0.06), _r(0.05)),
                               decode_shares={"matmul": [0.2, 0.21, 0.19], "attention": [0.6, 0.61, 0.59]}).sentences)
    assert "0.8× slower" in other and "cannot tell the two apart" in other and "not the formula" in other
    assert "static cache decoded faster than" in other and "attention dominates here" in other
    noisy = " ".join(_findings(step_growth={"cache on": 0.6, "cache off": 0.7}).sentences)
    assert "cannot tell the two apart" in noisy  # a step that got faster without the cache is noise, not growth
    # the busy-laptop cases: one profiled step, overlapping samples, a long prompt that decoded faster
    one_step = " ".join(_findings(decode_shares={"matmul": 0.3, "attention": 0.62, "other": 0.08}).sentences)
    assert "cannot say which dominates" in one_step and "attention dominates" not in one_step
    even = " ".join(_findings(variants=_rows(["dynamic", "static"], "tpot_s", _r(0.05),
                                             _r(0.05, own=JITTER6))).sentences)
    assert "static cache decoded within noise of the dynamic one" in even and "inside ±2%" in even
    split = _rows([0, 1], "tpot_s", _r(0.06), _r(0.03))
    split["prompt_tokens"], split["ttft_s"], split["new_tokens"] = [32, 512], [0.1, 1.0], [8, 8]
    faster = " ".join(_findings(split=split).sentences)
    assert "got faster, which no cache can do" in faster and "rerun" in faster
    rows = {r["finding"]: r["value"] for r in _findings().rows}
    assert rows["TPOT static / dynamic cache (×)"] == pytest.approx(1.2)
    # the profiled step split as notebook 01 splits its own: 85 % matmul of a 65.7 ms step, 532 MB at 27 GB/s
    from labkit.model import hardware

    gap = hardware.decode_gap(0.0657, 532e6, 27.0, 1653, "cpu", matmul_s=0.85 * 0.0657)
    split3 = " ".join(_findings(gap=gap).sentences)
    assert "The profiled step is 30% its bytes at the probe's bandwidth; 55% more because the matrix-vector kernel read" in split3
    assert "15% per-operator overhead (largest: kernel)" in split3
    assert "profiled step is" not in text  # no split without a gap


def test_one_compile_story_in_one_unit_for_notebooks_04_05_08():
    from pathlib import Path

    from labkit.core import results
    from labkit.decoding import cache_variants

    ref = results.Results("r", rows=[
        {"section": "cache_variants", "variant": "static", "new_tokens": 64, "first_call_s": 2.0, "decode_tokens_per_s": 10.0,
         "samples": {"decode_tokens_per_s": [9.9, 10.0, 10.1]}},
        {"section": "cache_variants", "variant": "static+compile", "new_tokens": 64, "first_call_s": 52.0,
         "decode_tokens_per_s": 12.5, "agreement": 1.0, "samples": {"decode_tokens_per_s": [12.4, 12.5, 12.6]}}])
    story = cache_variants.compile_story(ref)
    assert story.gain == pytest.approx(1.25) and story.extra_first_s == pytest.approx(50.0)
    assert story.break_even_tokens == pytest.approx(50.0 / (0.1 - 0.08))  # 2,500 tokens
    assert "1.25× eager's decode tokens/s" in findings.compile_sentence(story) and "pays back after 2,500 tokens" in findings.compile_sentence(story)
    slower = cache_variants.compile_story(results.Results("r", rows=[
        dict(r, decode_tokens_per_s=8.0, samples={"decode_tokens_per_s": [7.9, 8.0, 8.1]})
        if r["variant"] == "static+compile" else r for r in ref.rows]))
    assert slower.break_even_tokens is None and "never pays back" in findings.compile_sentence(slower)
    # a gain inside the runs' spread (the medians 9 % apart, the ranges overlapping) pays back nothing a run can read
    noisy = cache_variants.compile_story(results.Results("r", rows=[
        dict(r, decode_tokens_per_s=10.9, samples={"decode_tokens_per_s": [9.8, 10.9, 11.0]})
        if r["variant"] == "static+compile" else r for r in ref.rows]))
    said = findings.compile_sentence(noisy)
    assert noisy.break_even_tokens is not None and "pays back after" not in said and "within noise" in said, said
    one_each = cache_variants.compile_story(results.Results("r", rows=[
        {k: v for k, v in r.items() if k != "samples"} for r in ref.rows]))
    assert "pays back after" not in findings.compile_sentence(one_each) and "no verdict" in findings.compile_sentence(one_each)
    assert not story.paired and "judged unpaired, recorded" in findings.compile_sentence(story)
    # rounds that pair up (one figure a round, 6 or more): judged paired, 8.6 % through ±15 % of drift is a gain
    walk = (0.85, 1.15, 0.9, 1.1, 0.95, 1.05, 0.88, 1.12)
    rounds = cache_variants.compile_story(results.Results("r", env={"date": "2026-12-07T12:00:00"}, rows=[
        dict(r, samples={"decode_tokens_per_s": [10.0 * f * (1.086 if r["variant"] == "static+compile" else 1) * j
                                                 for f, j in zip(walk, (1.004, 0.996, 1, 1.003, 0.997, 1, 1.002, 0.998))]})
        for r in ref.rows]))
    assert rounds.paired and rounds.steady.paired and rounds.steady.kind == "better" and rounds.judged == "judged paired"
    assert "judged paired" in findings.compile_sentence(rounds) and "pays back after" in findings.compile_sentence(rounds)
    unpaired = cache_variants.CompileStory(**{**rounds.__dict__, "eager_samples": rounds.eager_samples[:3],
                                              "compiled_samples": rounds.compiled_samples[:3]})
    assert not unpaired.paired and unpaired.judged == "judged unpaired, recorded 2026-12-07"
    with pytest.raises(ValueError, match="static\\+compile"):
        cache_variants.compile_story(results.Results("r", rows=ref.rows[:1]))
    shipped = cache_variants.compile_story()  # the reference that ships: 3 rounds, recorded before paired rounds
    assert not shipped.paired and shipped.judged == f"judged unpaired, recorded {shipped.recorded}"
    assert shipped.recorded == str(results.reference("05_kv_cache_compile").env["date"])[:10]
    assert results.is_reference(shipped.where) and "AMD EPYC" in shipped.where and shipped.new_tokens > 0 and shipped.gain > 0
    src = Path(__file__).parents[1] / "notebooks" / "src"
    for nb in ("04_warmup.py", "05_kv_cache.py", "08_tensorrt.py"):  # one reference, one story
        text = (src / nb).read_text()
        assert "compile_story(" in text and '"05_kv_cache_compile"' not in text, nb


def test_flash_attention_is_unavailable_for_an_fp32_model_on_a_gpu(monkeypatch):
    import torch

    from labkit.core import env

    monkeypatch.setattr(env, "capability", lambda name: env.Capability(name, True, "2.x", ""))
    fa = {d: {r["attn_implementation"]: r for r in kv.attention_status("cuda:0", dtype=d)}["flash_attention_2"]
          for d in (torch.float32, torch.float16, "bf16")}
    assert not fa[torch.float32]["available"] and "fp16 or bf16" in fa[torch.float32]["reason"]
    assert fa[torch.float16]["available"] and fa["bf16"]["available"]
    src = (Path(__file__).parents[1] / "notebooks" / "src" / "05_kv_cache.py").read_text()
    assert 'env.device() == "cuda"' not in src  # LABKIT_DEVICE=cuda:0 is a CUDA device too


def test_the_cache_speedup_is_judged_paired_over_the_loops_rounds():
    """The loop with and without the cache in rounds: the speedup's verdict pairs round i of each (its reason in the
    sentence); rounds whose ratio flips name no winner; fewer than 6 rounds are no verdict."""
    on = _r(1.0, WALK6)
    text = " ".join(_findings(loop_s={"cache on": on, "cache off": _r(4.0, WALK6, JITTER6)}).sentences)
    assert "4.0× faster than without it (paired sign-flip test, 6 pairs" in text
    flips = _r(1.0, WALK6, (1.3, 0.75, 1.25, 0.8, 1.2, 0.85))
    text = " ".join(_findings(speedup=1.0, loop_s={"cache on": on, "cache off": flips}).sentences)
    assert "1.0× (no verdict (6 pairs)) against without it (paired sign-flip test, 6 pairs" in text
    assert "run " in text and "more pairs" in text
    text = " ".join(_findings(loop_s={"cache on": on[:3], "cache off": _r(4.0, WALK6)[:3]}).sentences)
    assert "4.0× (no verdict (3 pairs)) against without it (3 pairs: a paired test needs at least 6" in text


def test_the_reveal_names_a_faster_cache_only_when_the_takeaway_would():
    """The recorded run: eager 805–959 ms and sdpa 756–863 ms TTFT overlap. Paired round by round, an sdpa 9 %
    faster in every round is named, though the ranges overlap; rounds that disagree name no winner in the reveal
    either, and say how many more pairs would tell."""
    steady = _rows(["eager", "sdpa"], "ttft_s", _r(0.88, WALK6), _r(0.80, WALK6, JITTER6))
    assert verdict.compare(steady.samples["sdpa"]["ttft_s"], steady.samples["eager"]["ttft_s"]).kind == verdict.NOISE
    assert nb05.faster_of(steady, ["eager", "sdpa"], "ttft_s") == ("sdpa", "")
    mixed = _rows(["eager", "sdpa"], "ttft_s", _r(0.88, WALK6), _r(0.80, WALK6, (1.2, 0.9, 1.25, 0.85, 1.1, 0.95)))
    winner, why = nb05.faster_of(mixed, ["eager", "sdpa"], "ttft_s")
    assert winner is None and why.startswith("no verdict (paired sign-flip test, 6 pairs") and "more pairs" in why
    short = _rows(["eager", "sdpa"], "ttft_s", _r(0.88)[:3], _r(0.80)[:3])
    assert nb05.faster_of(short, ["eager", "sdpa"], "ttft_s") == (None, "no verdict (3 pairs: a paired test needs at "
                                                                       "least 6; run 3 more pairs)")
    apart = _rows(["dynamic", "static"], "tpot_s", _r(0.050), _r(0.060))
    assert nb05.faster_of(apart, ["dynamic", "static"], "tpot_s") == ("dynamic", "")
    assert nb05.faster_of(apart, ["static", "dynamic"], "tpot_s") == ("dynamic", "")


def test_a_model_whose_static_cache_cannot_run_says_why_instead_of_timing_it():
    reason = "transformers' StaticCache cannot hold this model's cache (RuntimeError: index_copy_(): …)"
    dyn = _rows(["dynamic"], "tpot_s", [0.050, 0.051, 0.049])
    found = _findings(variants=dyn, static_reason=reason)
    text = " ".join(found.sentences)
    assert f"The static cache did not run on this model: {reason}." in text and "static cache decoded" not in text
    assert {r["finding"]: r["value"] for r in found.rows}["TPOT static / dynamic cache (×)"] is None
    with pytest.raises(ValueError, match="static_reason"):
        _findings(variants=dyn)


def test_static_cache_reason_asks_the_model(tiny_llama):
    model, tok = tiny_llama
    assert cache_variants.static_cache_reason(model, tok) == ""
    from unittest import mock

    boom = RuntimeError("index_copy_(): Source/destination tensor must have same slice shapes.")
    with mock.patch.object(type(model), "generate", side_effect=boom):
        said = cache_variants.static_cache_reason(model, tok)
    assert said.startswith("transformers' StaticCache cannot hold this model's cache (RuntimeError: index_copy_()")
