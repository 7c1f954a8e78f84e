"""Notebook 10's pieces: prompt lookup (the draft rule is transformers', the tokens are plain greedy's),
prefix caching and chunked prefill measured from the client, quantised KV caches, llama.cpp and the
engine table, and the bench's headline."""
from __future__ import annotations

import importlib.util
import random
import statistics

import pytest
import torch

from labkit.core import timing
from labkit.model import onnx
from labkit.decoding import decode, speculative
from labkit.precision import kvquant, quantisers
from labkit.engines import cpu, llamacpp
from labkit.serve import prefix_cache, server
from labkit.serve.experiments import prefill
from labkit.lessons.nb10 import runs as nb10_runs

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


# ------------------------------------------------------------------------------------------ speculative


def test_draft_rule_matches_transformers_prompt_lookup():
    from transformers import LogitsProcessorList, MinNewTokensLengthLogitsProcessor
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(0)
    no_eos = LogitsProcessorList([MinNewTokensLengthLogitsProcessor(0, 10**6, 1)])  # what min_new_tokens adds
    for trial in range(300):
        ids = [rng.randrange(1, 7) for _ in range(rng.randrange(2, 40))]  # token 1 is end-of-sequence
        k, ngram = rng.randrange(1, 6), rng.randrange(1, 4)
        gen = PromptLookupCandidateGenerator(eos_token_id=torch.tensor([1]), num_output_tokens=k,
                                             max_matching_ngram_size=ngram, max_length=10_000,
                                             logits_processor=no_eos, vocab_size=8)
        cand, _ = gen.get_candidates(torch.tensor([ids]))
        assert speculative.draft_from_context(ids, ngram, k, eos=[1]) == cand[0, len(ids):].tolist(), (ids, k, ngram)


def test_draft_stops_before_eos_and_is_empty_without_a_match():
    assert speculative.draft_from_context([5, 6, 7, 1, 8, 5, 6], 2, 5, eos=[1]) == [7]
    assert speculative.draft_from_context([5, 6, 1, 5, 6, 9, 5, 6], 2, 5, eos=[1]) == [9, 5, 6], "skips an eos-only draft"
    assert speculative.draft_from_context([1, 2, 3, 4], 2, 5) == []
    assert speculative.draft_from_context([4, 9, 4, 8, 4], 1, 2) == [9, 4], "the earliest occurrence first"
    with pytest.raises(ValueError, match="num_tokens"):
        speculative.draft_from_context([1, 2], 2, -1)
    assert speculative.draft_from_context([1, 2, 1, 2], 1, 0) == []


def test_accept_rule():
    assert speculative.accept([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]
    assert speculative.accept([5, 6, 7], [5, 9, 7, 8]) == [5, 9]
    assert speculative.accept([], [3]) == [3]


def _repetitive(seed=1):
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(3, 90, (1, 30), generator=g)
    return torch.cat([base, base, base[:, :5]], 1)


def test_lookup_decode_gives_plain_greedy_tokens_in_fewer_passes():
    from labkit.lessons import exercises

    model = exercises.tiny_llama()
    ids = _repetitive()
    run = speculative.lookup_decode(model, ids, new_tokens=40, num_tokens=5)
    assert run.tokens == decode.greedy(model, ids, new_tokens=40)[0].tolist()
    assert len(run.tokens) == 40 and run.forward_passes < 40
    assert run.accepted == len(run.tokens) - run.forward_passes, "each pass adds its accepted tokens plus one"
    assert 0 < run.acceptance_rate <= 1 and run.tokens_per_forward == 40 / run.forward_passes
    lib = speculative.timed_generate(model, ids, 40, prompt_lookup_num_tokens=5)
    assert lib["tokens"] == run.tokens and lib["forward_passes"] == run.forward_passes


def test_timed_generate_counts_one_pass_per_token_without_lookup_and_keeps_exactly_n():
    from labkit.lessons import exercises

    model = exercises.tiny_llama()
    ids = _repetitive(2)
    plain = speculative.timed_generate(model, ids, 12)
    assert plain["n_out"] == 12 and plain["forward_passes"] == 12 and plain["tokens_per_forward"] == 1
    assert plain["ttft_s"] > 0 and plain["decode_tokens_per_s"] > 0
    row = speculative.compare_lookup(model, ids, 30, num_tokens=5, repeats=1, label="copy")
    assert row["identical"] and row["lookup_forward_passes"] < row["plain_forward_passes"] == 30
    with pytest.raises(ValueError, match="new_tokens"):
        speculative.timed_generate(model, ids, 0)


def test_draft_model_pair_check_and_run():
    from labkit.lessons import exercises

    target, draft = exercises.tiny_llama(layers=2, seed=0), exercises.tiny_llama(layers=1, seed=0)

    class Tok:  # the tiny models share one made-up vocabulary
        def __init__(self, n):
            self.vocab = {str(i): i for i in range(n)}

        def get_vocab(self):
            return self.vocab

    assert speculative.draft_pair_reason(target, Tok(96), draft, Tok(96)) == ""
    other = exercises.tiny_llama(vocab_size=64)
    assert "vocabulary sizes differ" in speculative.draft_pair_reason(target, Tok(96), other, Tok(64))
    assert "no draft" in speculative.draft_pair_reason(target, Tok(96), None, None)
    row = speculative.compare_lookup(target, _repetitive(3), 16, num_tokens=3, repeats=1, assistant_model=draft,
                                     prompt_lookup_num_tokens=None)
    assert row["identical"], "a draft model never changes greedy tokens"


# --------------------------------------------------------------------------------------- prefix / chunks


def test_reusable_prefix_is_the_prefix_caches_rule():
    from transformers import DynamicCache

    rng = random.Random(0)
    for _ in range(100):
        cached = [rng.randrange(2) for _ in range(rng.randrange(1, 40))]
        prompt = cached[:rng.randrange(0, len(cached) + 1)] + [rng.randrange(2) for _ in range(rng.randrange(1, 10))]
        block = rng.choice([1, 4, 8])
        pc = prefix_cache.PrefixCache(10_000, block)
        cache = DynamicCache()
        cache.update(torch.zeros(1, 1, len(cached), 2), torch.zeros(1, 1, len(cached), 2), 0)
        pc.store(cached, cache)
        stored = len(cached) // block * block  # the cache keeps whole blocks only
        assert pc.lookup(prompt)[0] == prefill.reusable_prefix(cached[:stored], prompt, block), (cached, prompt, block)


def test_itl_stats_window_counts_a_stall_that_overlaps_it():
    stamps = [[0.0, 0.1, 0.2, 1.5, 1.6], [0.05, 0.15, 1.55]]
    whole = timing.itl_stats(stamps)
    assert whole["n"] == 6 and whole["max_s"] == pytest.approx(1.4)
    during = timing.itl_stats(stamps, (0.3, 1.0))
    assert during["n"] == 2 and during["max_s"] == pytest.approx(1.4)
    assert timing.itl_stats([[0.0]])["p99_s"] is None
    assert whole["p99_s"] is None, "6 gaps: too few for a 1 % tail (timing.P99_MIN_SAMPLES)"
    many = timing.itl_stats([[i * 0.01 for i in range(101)]])
    assert many["n"] == 100 and many["p99_s"] == pytest.approx(0.01)


def test_prefix_cache_run_hits_and_answers_the_same():
    lm = server.tiny_random_model()
    doc = prefill.document_text(lm.tokenizer, 120)
    prompts = prefill.shared_prefix_prompts(doc, nb10_runs.QUESTIONS[:4])
    off = prefill.prefix_cache_run(lm, prompts, max_tokens=3, concurrency=2, prefix_cache_tokens=0)
    on = prefill.prefix_cache_run(lm, prompts, max_tokens=3, concurrency=2, prefix_cache_tokens=2048)
    assert off["texts"] == on["texts"] and all(on["texts"])
    assert off["cache_queries"] == 0 and on["cache_queries"] == 4 and on["cache_hits"] == 3
    assert on["hit_rate"] == 0.75 and on["token_hit_rate"] > 0.5
    with pytest.raises(ValueError, match="questions"):
        prefill.shared_prefix_prompts(doc, [])


def test_chunked_prefill_run_streams_through_the_long_prefill():
    lm = server.tiny_random_model()
    long_prompt = prefill.document_text(lm.tokenizer, 600)
    prompts = list(nb10_runs.STREAM_PROMPTS[:2])
    off = prefill.chunked_prefill_run(lm, prompts, 20, long_prompt, 0, long_after=3)
    on = prefill.chunked_prefill_run(lm, prompts, 20, long_prompt, 64, long_after=3)
    assert off["texts"] == on["texts"]
    assert all(len(s) == 20 for r in (off, on) for s in r["stamps"])
    assert on["gaps_during_long_prefill"] > off["gaps_during_long_prefill"], "chunked: streams keep getting tokens"
    assert off["long_ttft_s"] > 0 and on["itl_max_s"] > 0 and on["itl_p99_s"] is None  # 38 gaps: no p99
    with pytest.raises(ValueError, match="long_after"):
        prefill.chunked_prefill_run(lm, prompts, 3, long_prompt, 0, long_after=3)


def test_prefix_cache_rounds_pair_each_round_and_start_every_pass_from_an_empty_cache():
    lm = server.tiny_random_model()
    doc = prefill.document_text(lm.tokenizer, 120)
    prompts = prefill.shared_prefix_prompts(doc, nb10_runs.QUESTIONS[:4])
    off, on = prefill.prefix_cache_rounds(lm, prompts, max_tokens=2, concurrency=2, prefix_cache_tokens=2048, rounds=3)
    assert (off["prefix_cache_tokens"], on["prefix_cache_tokens"]) == (0, 2048)
    assert len(off["samples"]["ttft_p50_s"]) == len(on["samples"]["ttft_p50_s"]) == 3, "one statistic per round"
    assert len(on["ttft_s"]) == 12 and off["texts"] == on["texts"] and on["same_texts_every_round"]
    # flushed before every pass (the warm-up pass not counted): each round misses its first request alone
    assert off["cache_queries"] == 0 and on["cache_queries"] == 12 and on["cache_hits"] == 9
    assert on["ttft_p50_s"] == statistics.median(on["samples"]["ttft_p50_s"])
    assert all(sorted(o) == ["A", "B"] for o in on["order"])


def test_chunked_prefill_rounds_keep_one_stall_and_one_ttft_per_round():
    lm = server.tiny_random_model()
    long_prompt = prefill.document_text(lm.tokenizer, 600)
    prompts = list(nb10_runs.STREAM_PROMPTS[:2])
    off, on = prefill.chunked_prefill_rounds(lm, prompts, 12, long_prompt, 64, rounds=2, long_after=3)
    assert (off["prefill_chunk_tokens"], on["prefill_chunk_tokens"]) == (0, 64) and off["texts"] == on["texts"]
    for r in (off, on):
        assert len(r["samples"]["stall_s"]) == len(r["samples"]["long_ttft_s"]) == 2
        assert r["itl_n"] == 2 * 2 * 11, "gaps pooled over both rounds"
        assert r["long_ttft_s"] == statistics.median(r["samples"]["long_ttft_s"])
        assert all(len(s) == 12 for s in r["stamps"]), "the first round's stamps, for the figure"
    with pytest.raises(ValueError, match="long_after"):
        prefill.chunked_prefill_rounds(lm, prompts, 3, long_prompt, 64, rounds=2, long_after=3)


# ------------------------------------------------------------------------------------------- KV quant


def test_quantize_kv_per_channel_round_trip():
    x = torch.randn(1, 2, 50, 8)
    x[..., 3] *= 40
    q, scale = quantisers.quantize_kv(x)
    assert q.dtype == torch.int8 and scale.shape == (1, 2, 1, 8)
    assert torch.all((quantisers.dequantize_kv(q, scale) - x).abs() <= scale / 2 + 1e-6)


def test_cache_bytes_of_dynamic_lab_and_fp16_caches(tiny_llama):
    from transformers import DynamicCache

    from labkit.decoding import kv

    model, _ = tiny_llama
    ids = torch.randint(3, 1000, (1, 300))
    sizes = {}
    for name, cache in {"fp32": DynamicCache(), "fp16": kvquant.fp16_storage_cache(model.config, 16),
                        "int8": kvquant.lab_cache(model.config, residual_length=16)}.items():
        with torch.inference_mode():
            model(ids, past_key_values=cache, use_cache=True)
        sizes[name] = kvquant.cache_storage_bytes(cache)
        if name == "fp32":
            assert sizes[name] == kv.cache_bytes(cache)
    assert sizes["fp16"] == sizes["fp32"] // 2
    n_channels = 2 * 2 * 2 * 16  # K and V × layers × KV heads × head_dim: one fp32 scale each
    assert sizes["int8"] == sizes["fp32"] // 4 + n_channels * 4


def test_storage_bytes_walks_subclasses_and_containers():
    class Packed(torch.Tensor):
        @staticmethod
        def __new__(cls, data):
            return torch.Tensor._make_wrapper_subclass(cls, (data.numel() * 2,), dtype=torch.float32)

        def __init__(self, data):
            self._data = data

        def __tensor_flatten__(self):
            return ["_data"], None

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError

    packed = Packed(torch.zeros(10, dtype=torch.uint8))
    assert kvquant.storage_bytes(packed) == 10
    assert kvquant.storage_bytes((torch.zeros(3, dtype=torch.uint8), {"scale": torch.zeros(2), "shape": (1, 2)})) == 11


def test_compare_caches_reference_row_and_quality(tiny_llama):
    model, tok = tiny_llama
    ctx = kvquant.context_ids(tok, 200, model.device)
    rows = kvquant.compare(model, ctx, 6, {"int8": lambda: kvquant.lab_cache(model.config, residual_length=4)})
    ref, q = rows
    assert ref["agreement"] == 1.0 and ref["kl"] == 0.0 and ref["bytes_ratio"] == 1.0
    assert q["bytes_ratio"] > 3 and q["agreement"] >= 0.5 and q["kl"] >= 0
    with pytest.raises(ValueError, match="evaluation text"):
        kvquant.context_ids(tok, 10**6, "cpu")


def test_compare_turns_a_failing_cache_into_a_row_and_runs_the_others(tiny_llama):
    """A backend that cannot run on this device (no kernel for the GPU, say) fails that cache's row only."""
    model, tok = tiny_llama
    ctx = kvquant.context_ids(tok, 40, model.device)

    def no_kernel(x):
        raise RuntimeError("quantize: no kernel image is available for execution on the device")

    rows = kvquant.compare(model, ctx, 4, {"broken int4": lambda: kvquant.lab_cache(model.config, no_kernel, residual_length=4),
                                           "int8": lambda: kvquant.lab_cache(model.config, residual_length=4)})
    by = {r["cache"]: r for r in rows}
    assert by["broken int4"]["status"].startswith("failed here: RuntimeError: quantize: no kernel")
    assert by["broken int4"]["kv_bytes"] is None and by["broken int4"]["bytes_ratio"] is None
    assert by["int8"]["status"] == "ok" and by["int8"]["bytes_ratio"] > 1 and rows[0]["status"] == "ok"
    head = nb10_runs.headline([], [], [], rows, [])
    assert head["kv_quant_cache"] == "int8", "a failed cache is never the headline"

    def bug(x):
        raise AssertionError("a broken invariant")  # labkit's own bug: surfaced, never a row

    with pytest.raises(AssertionError, match="broken invariant"):
        kvquant.compare(model, ctx, 4, {"bug": lambda: kvquant.lab_cache(model.config, bug, residual_length=4)})


def test_backend_reason_probes_on_the_device_and_dtype_asked(monkeypatch):
    """Notebook 10 runs its quantised caches on the model's device: the probe must run there too."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen = []

    def record(model, ids, cache=None):
        seen.append((str(ids.device), str(next(model.parameters()).device), next(model.parameters()).dtype))
        return None, cache

    def fake_to(module, *args, device=None, dtype=None, **kw):  # Module.to cannot swap fake tensors across devices
        for sub in module.modules():
            for name, p in list(sub._parameters.items()):
                if p is not None:
                    sub._parameters[name] = torch.nn.Parameter(
                        torch.empty(p.shape, dtype=dtype or p.dtype, device=device or p.device), requires_grad=False)
        return module

    if importlib.util.find_spec("optimum.quanto") is None:
        pytest.skip("optimum-quanto is not installed: the probe stops before building its model")
    from transformers import LlamaForCausalLM

    monkeypatch.setattr(kvquant, "prefill", record)
    monkeypatch.setattr(LlamaForCausalLM, "to", fake_to)
    with FakeTensorMode(allow_non_fake_inputs=True):  # fake CUDA tensors: the probe's model and ids, on a CPU
        reason = kvquant.backend_reason("quanto", "cuda:0", "fp16")
    assert seen and all(s == ("cuda:0", "cuda:0", torch.float16) for s in seen), (seen, reason)
    assert reason == ""


def test_backend_reason():
    with pytest.raises(ValueError, match="backend"):
        kvquant.backend_reason("nope")
    for backend, (dist, module) in kvquant.BACKENDS.items():
        reason = kvquant.backend_reason(backend)
        try:
            installed = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            installed = False
        assert (reason == "") == installed or "failed" in reason, reason
        if not installed:
            assert "pip install" in reason


# ------------------------------------------------------------------------------------ llama.cpp, engines


def test_llamacpp_capability_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    cap = llamacpp.capability()
    assert not cap.available and "pip install 'labkit[llamacpp]'" in cap.reason and "GGML_NATIVE=OFF" in cap.reason
    with pytest.raises(ValueError, match="Q8_0"):
        llamacpp.requantize("Q9")


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python not installed (pip install 'labkit[llamacpp]')")
def test_llamacpp_runs_the_default_gguf_and_agrees_with_the_reference(default_lm):
    from labkit.model import models
    from labkit.decoding import quality

    cap = llamacpp.capability()
    assert cap.available, cap.reason
    tok = default_lm.tokenizer
    ref = quality.reference(default_lm.model, tok, ["What is the capital of France?"], new_tokens=6)
    row = cpu.measure_llamacpp("llama.cpp", "Q4_1", models.default_gguf(), tok,
                                       "What is the capital of France?", 6, 1, ref)
    assert row["status"] == "ok" and row["decode_tokens_per_s"] > 0 and row["llamacpp_eval_tokens"] > 0
    assert row["agreement"] >= 0.5, "the GGUF's Q4_1 weights are the reference's weights"
    path, _ = llamacpp.requantize("Q8_0")
    assert path.stat().st_size > models.default_gguf().stat().st_size


def test_best_lab_row_and_headline():
    engines = [{"engine": "PyTorch", "format": "fp32", "status": "ok", "decode_tokens_per_s": 10.0, "agreement": 1.0},
               {"engine": "ONNX Runtime", "format": "4-bit", "status": "ok", "decode_tokens_per_s": 30.0, "agreement": 0.8},
               {"engine": "llama.cpp", "format": "Q4_1", "status": "ok", "decode_tokens_per_s": 40.0, "agreement": 0.95},
               {"engine": "llama.cpp", "format": "Q8_0", "status": "cannot", "decode_tokens_per_s": 99.0}]
    assert cpu.best_lab_row(engines)["format"] == "4-bit"
    assert cpu.best_lab_row(engines, min_agreement=0.9)["format"] == "fp32"
    lookup = [{"task": "copy", "decode_speedup": 2.5, "tokens_per_forward": 4.0, "identical": True},
              {"task": "chat", "decode_speedup": 0.9, "tokens_per_forward": 1.0, "identical": True}]
    prefix = [{"ttft_p50_s": 0.4, "texts": ["a"], "hit_rate": None}, {"ttft_p50_s": 0.1, "texts": ["a"], "hit_rate": 0.75}]
    chunked = [{"itl_p99_s": 1.0, "itl_max_s": 3.0, "long_ttft_s": 1.0, "texts": ["x"]},
               {"itl_p99_s": 0.25, "itl_max_s": 0.5, "long_ttft_s": 2.0, "texts": ["x"]}]
    kv = [{"cache": "fp32", "bytes_ratio": 1.0, "decode_tokens_per_s": 20.0, "agreement": 1.0, "kl": 0.0},
          {"cache": "quanto int4", "bytes_ratio": 6.0, "decode_tokens_per_s": 10.0, "agreement": 0.9, "kl": 0.01},
          {"cache": "quanto int2", "bytes_ratio": 8.0, "decode_tokens_per_s": 10.0, "agreement": 0.5, "kl": 0.3}]
    h = nb10_runs.headline(lookup, prefix, chunked, kv, engines, kv_name="quanto int4", quality_floor=0.5)
    assert h["lookup_copy_decode_speedup"] == 2.5 and h["lookup_identical_to_greedy"]
    assert h["prefix_cache_ttft_ratio"] == 4.0 and h["prefix_cache_outputs_identical"]
    assert h["chunked_prefill_itl_p99_ratio"] == 4.0 and h["chunked_prefill_long_ttft_ratio"] == 2.0
    assert h["chunked_prefill_itl_max_ratio"] == 6.0
    few = [{**r, "itl_p99_s": None} for r in chunked]  # fewer than 100 gaps: no p99 to compare
    assert nb10_runs.headline([], [], few, kv, engines)["chunked_prefill_itl_p99_ratio"] is None
    assert h["kv_quant_bytes_ratio"] == 6.0 and h["kv_quant_speed_ratio"] == 0.5
    assert h["lab_best_over_llamacpp_decode"] == 0.75 and h["llamacpp_agreement"] == 0.95
    assert nb10_runs.headline([], [], [], kv, engines[:2])["llamacpp_reason"] == "not run"
    assert nb10_runs.headline([], [], [], kv, engines)["lab_best_engine"] == "PyTorch fp32", "0.8 agreement is below 0.9"
    assert nb10_runs.headline([], [], [], kv, engines)["kv_quant_cache"] == "quanto int2"


def test_nbits_reason_and_bad_settings():
    reason = onnx.nbits_reason()
    assert reason == "" or "pip install" in reason
    with pytest.raises(ValueError, match="bits"):
        onnx.quantize_nbits(bits=3)
    with pytest.raises(ValueError, match="block_size"):
        onnx.quantize_nbits(block_size=33)
    with pytest.raises(ValueError, match="accuracy_level"):
        onnx.quantize_nbits(accuracy_level=9)


def test_beside_vllm_puts_each_figure_and_tokens_check_in_one_row():
    lab_prefix = [{"ttft_p50_s": 0.8, "requests": 4, "texts": ["a", "b"], "token_hit_rate": None},
                  {"ttft_p50_s": 0.4, "requests": 4, "texts": ["a", "b"], "token_hit_rate": 0.5}]
    lab_chunked = [{"itl_p99_s": None, "itl_max_s": 1.2, "itl_n": 30, "itl_during_long_prefill_max_s": 1.2,
                    "long_ttft_s": 1.0, "prefill_chunk_tokens": 0, "texts": ["x"]},
                   {"itl_p99_s": None, "itl_max_s": 0.3, "itl_n": 30, "itl_during_long_prefill_max_s": 0.3,
                    "long_ttft_s": 1.5, "prefill_chunk_tokens": 128, "texts": ["x"]}]
    lab_lookup = [{"task": "copy", "acceptance_rate": 0.9, "decode_speedup": 2.0, "identical": True,
                   "mechanism_tokens_match": True}]
    wobble = [1.0, 1.1, 0.95, 1.05, 0.9, 1.02]  # six rounds: the machine's drift, shared by both sides of a round

    def chunk(stall, p99, budget, answers):
        return {"itl_p99_s": p99, "itl_max_s": p99, "itl_n": 120, "stall_p50_s": stall, "long_ttft_p50_s": 1.0,
                "rounds": 6, "max_num_batched_tokens": budget, "answers": answers,
                "samples": {"stall_s": [stall * w for w in wobble], "long_ttft_s": [1.0] * 6}}
    served = {"prefix": {"without": {"ttft_p50_s": 0.6, "token_hit_rate": 0.0, "rounds": 6, "answers": {"q0": [5, 6]},
                                     "samples": {"ttft_s": [0.6] * 24, "ttft_p50_s": [0.6 * w for w in wobble]}},
                         "with": {"ttft_p50_s": 0.2, "token_hit_rate": 0.6, "rounds": 6, "answers": {"q0": [5, 6]},
                                  "samples": {"ttft_s": [0.6, 0.1] * 12, "ttft_p50_s": [0.2 * w for w in wobble]}}},
              "chunked": {"large": chunk(1.4, 1.3, 2048, [[7, 8, 2, 9]]), "small": chunk(0.35, 0.4, 128, [[7, 9]])},
              "speculative": {"copy": {"acceptance_rate": 1.0, "decode_speedup": 4.0, "rounds": 4, "verdict": "better",
                                       "ngram_answer": [1, 2, 3], "plain_answer": [1, 2, 3]}}}
    refs = {"prefix": {"q0": [5, 6]}, "streams": {"stream 0": [7, 8]}, "lookup": {"copy": [1, 2, 3]}}
    rows = {r["figure"]: r for r in nb10_runs.beside_vllm(lab_prefix, lab_chunked, lab_lookup, served, refs, {2})}
    ttft = rows["TTFT without / with the cached prefix (median, ×)"]
    assert (ttft["labkit"], ttft["vllm"]) == (pytest.approx(2.0), pytest.approx(3.0))
    assert ttft["vllm_tokens"].startswith("with the cache identical (1 of 1)")
    itl = rows["running streams' ITL tail, whole / chunked prompt (×)"]
    assert itl["labkit"] == pytest.approx(4.0) and itl["vllm"] == pytest.approx(1.3 / 0.4)
    assert "labkit: ITL max of 30 gaps" in itl["note"] and "vLLM: ITL p99 of 120 gaps" in itl["note"]
    assert "small budget differ: stream 0 from token 1" in itl["vllm_tokens"], "the large budget's answer stops at eos"
    stall = rows["streams' worst gap while the long prompt prefills, whole / chunked (×)"]
    assert stall["vllm"] == pytest.approx(4.0) and stall["labkit"] == pytest.approx(4.0)
    spec = rows["decode speedup, copy (×)"]
    assert (spec["labkit"], spec["vllm"]) == (2.0, 4.0) and "n-gram identical (1 of 1)" in spec["vllm_tokens"]
    assert rows["draft tokens accepted, copy (share)"]["vllm"] == 1.0
    assert spec["vllm_verdict"] == "better" and stall["vllm_verdict"] == "better", "6 pairs, each 4× apart"
    assert ttft["vllm_verdict"] == "better" and "verdicts paired round by round" in ttft["note"]
    assert ttft["note"].startswith("labkit one run of 4 requests"), "a lab row without rounds: one run"
    four = {"prefix": {m: {**r, "samples": {**r["samples"], "ttft_p50_s": r["samples"]["ttft_p50_s"][:4]}}
                       for m, r in served["prefix"].items()}}
    got = nb10_runs.beside_vllm(lab_prefix, lab_chunked, lab_lookup, four, refs, {2})[0]
    assert got["vllm_verdict"] == "no verdict (4 pairs)", "4 rounds: too few pairs for the paired test, whatever the gap"
    rounds = [{**r, "rounds": 6} for r in lab_prefix]
    assert nb10_runs.beside_vllm(rounds, lab_chunked, lab_lookup, four, refs, {2})[0]["note"].startswith(
        "labkit the median of 6 interleaved rounds' medians")
    quick = {k: served[k] for k in ("prefix",)}  # quick mode: one vllm serve start, the prefix cache alone
    only = nb10_runs.beside_vllm(lab_prefix, lab_chunked, lab_lookup, quick, {**refs, "streams": {}}, {2})
    assert {r["mechanism"] for r in only} == {"prefix caching"} and len(only) == 2
