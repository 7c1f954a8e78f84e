"""Tensor-parallel sizing on the public configs in data/configs (labkit.model.parallel).

Every expected value is computed here from the config.json fields (layers, heads, KV heads, hidden size), never
typed in; the weight totals come from ``sizing`` (parameters counted on the meta device) and are checked split.
"""
from __future__ import annotations

import json

import pytest

from labkit.core import config
from labkit.model import gpus, kvlayout, parallel, sizing

CONFIGS = config.DATA_DIR / "configs"
PUBLIC = sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file())


def buildable(name: str) -> None:
    """Skip, saying why, a config whose model_type the installed transformers cannot build (its parameters are
    counted on a model built on the meta device)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    c = json.loads((CONFIGS / name / "config.json").read_text(encoding="utf-8"))
    if c.get("model_type") not in CONFIG_MAPPING_NAMES and not (
            set(c.get("architectures") or []) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())):
        pytest.skip(f"transformers {transformers.__version__} cannot build model_type {c.get('model_type')!r}")


def fields(name: str) -> dict:
    buildable(name)
    c = kvlayout.text_config(json.loads((CONFIGS / name / "config.json").read_text(encoding="utf-8")))
    heads = c["num_attention_heads"]
    return {"layers": c["num_hidden_layers"], "heads": heads, "kv": c.get("num_key_value_heads") or heads,
            "hidden": c["hidden_size"], "head_dim": c.get("head_dim") or c["hidden_size"] // heads,
            "inter": c.get("intermediate_size") or c["moe_intermediate_size"], "latent": (c["kv_lora_rank"] + c["qk_rope_head_dim"]
                                                        if c.get("kv_lora_rank") else None),
            "uniform": kvlayout.uniform(kvlayout.layers(c))}


def accepted(f: dict, d: int) -> bool:
    """vLLM 0.32's rules, from the config fields: heads split evenly, KV heads split or replicated evenly."""
    kv_ok = f["kv"] % d == 0 if d <= f["kv"] else d % f["kv"] == 0
    return f["heads"] % d == 0 and kv_ok and f["inter"] % d == 0


def test_the_public_configs_are_all_here():
    assert {"Llama-3.1-8B", "Qwen2.5-1.5B-Instruct", "SmolLM2-135M-Instruct"} <= set(PUBLIC), PUBLIC


@pytest.mark.parametrize("name", PUBLIC)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_kv_all_reduce_and_legality_follow_the_config_fields(name, dtype):
    f = fields(name)
    width = {"bf16": 2, "fp32": 4}[dtype]
    context, batch = 1000, 3
    rows = parallel.tp_plan(str(CONFIGS / name), dtype, degrees=(1, 2, 3, 4, 8), context_tokens=context, batch=batch)
    assert [r["degree"] for r in rows] == [1, 2, 3, 4, 8]
    for r in rows:
        d = r["degree"]
        assert r["legal"] == accepted(f, d), (name, d, r["why_not"])
        if not r["legal"]:
            assert r["weights_bytes_per_gpu"] is None and r["why_not"] and r["note"] == r["why_not"]
            continue
        kv_per_gpu = max(1, f["kv"] // d)
        assert r["kv_heads_per_gpu"] == kv_per_gpu
        assert r["kv_head_replicas"] == (d // f["kv"] if d > f["kv"] else 1)
        if f["uniform"]:
            assert r["kv_bytes_per_gpu"] == 2 * f["layers"] * kv_per_gpu * f["head_dim"] * width * context * batch
        elif f["latent"]:  # MLA: the latent has no heads to split, every GPU keeps all of it
            assert r["kv_bytes_per_gpu"] == f["layers"] * f["latent"] * width * context * batch
        else:
            assert r["kv_bytes_per_gpu"] <= rows[0]["kv_bytes_per_gpu"]
        per_token = 2 * f["layers"] * f["hidden"] * width if d > 1 else 0
        assert r["all_reduce_bytes_per_token"] == per_token
        assert r["all_reduce_bytes_per_step"] == per_token * batch
        assert r["ring_bytes_sent_per_gpu_per_step"] == int(2 * (d - 1) / d * per_token * batch)
        assert r["total_bytes_per_gpu"] == pytest.approx(r["weights_bytes_per_gpu"] + r["kv_bytes_per_gpu"], abs=1)
        assert r["fits"] is None  # no GPU given


@pytest.mark.parametrize("name", PUBLIC)
def test_weights_split_evenly_until_kv_heads_are_replicated(name):
    f = fields(name)
    whole = sizing.weight_bytes(sizing.shape(str(CONFIGS / name)), "bf16")
    for r in parallel.tp_plan(str(CONFIGS / name), "bf16", degrees=(1, 2, 3, 4, 6, 8)):
        if not r["legal"]:
            continue
        d = r["degree"]
        # each GPU keeps a whole KV head's k_proj and v_proj when there are fewer KV heads than GPUs
        extra = 2 * f["layers"] * f["hidden"] * f["head_dim"] * (1 - f["kv"] / d) * 2 if d > f["kv"] else 0
        assert r["weights_bytes_per_gpu"] == pytest.approx(whole / d + extra, abs=1), (name, d)


def test_qwen25_replicates_its_two_kv_heads_at_tp4_and_vllm_refuses_tp8():
    f = fields("Qwen2.5-1.5B-Instruct")
    assert (f["heads"], f["kv"]) == (12, 2), "the case this test is about: 12 heads, 2 KV heads"
    rows = {r["degree"]: r for r in parallel.tp_plan(str(CONFIGS / "Qwen2.5-1.5B-Instruct"), degrees=(2, 4, 8))}
    assert rows[4]["kv_head_replicas"] == 2 and rows[4]["kv_bytes_per_gpu"] == rows[2]["kv_bytes_per_gpu"]
    assert "replicated 2×" in rows[4]["note"]
    assert not rows[8]["legal"] and "must be divisible by tensor parallel size (8)" in rows[8]["why_not"]


def test_quantised_weights_all_reduce_fp16_activations():
    f = fields("Llama-3.1-8B")
    rows = parallel.tp_plan(str(CONFIGS / "Llama-3.1-8B"), "int8", degrees=(2,))
    assert rows[0]["all_reduce_bytes_per_token"] == 2 * f["layers"] * f["hidden"] * 2


def test_fit_uses_the_usable_fraction_of_the_gpu():
    path = str(CONFIGS / "Llama-3.1-8B")
    total = parallel.tp_plan(path, "bf16", degrees=(1,))[0]["total_bytes_per_gpu"]
    just_enough = total / sizing.USABLE_FRACTION / 2**30 * 1.001
    assert parallel.tp_plan(path, "bf16", degrees=(1,), gpu_memory_gib=just_enough)[0]["fits"] is True
    assert parallel.tp_plan(path, "bf16", degrees=(1,), gpu_memory_gib=just_enough * 0.99)[0]["fits"] is False
    spec = gpus.gpu("H100-SXM")
    row = parallel.tp_plan(path, "bf16", degrees=(1,), gpu="h100")[0]
    assert row["gpu"] == spec.name and row["gpu_memory_gib"] == pytest.approx(spec.memory_bytes / 2**30)
    assert row["fits"] == (total <= spec.memory_bytes * sizing.USABLE_FRACTION)


def test_a_model_that_fits_one_gpu_gets_replicas_and_the_reasons():
    path = str(CONFIGS / "Llama-3.1-8B")
    total = parallel.tp_plan(path, "bf16", degrees=(1,))[0]["total_bytes_per_gpu"]
    roomy = total / sizing.USABLE_FRACTION / 2**30 * 2
    advice = parallel.replicas_or_tp(path, "bf16", roomy)
    assert advice["choice"] == "replicas" and advice["degree"] == 1 and advice["fits_one_gpu"]
    tp2 = 2 * fields("Llama-3.1-8B")["layers"] * fields("Llama-3.1-8B")["hidden"] * 2
    for phrase in ("replicas, not tensor parallelism", f"{tp2 / 1024:.0f} KiB for every generated token",
                   "failed GPU takes one replica down", "NVLink"):
        assert phrase in advice["why"], (phrase, advice["why"])


def test_a_model_too_big_for_one_gpu_gets_the_smallest_degree_that_fits():
    path = str(CONFIGS / "Llama-3.1-8B")
    rows = {r["degree"]: r for r in parallel.tp_plan(path, "bf16", degrees=(1, 2, 4))}
    # a GPU between what TP 2 and TP 1 need: TP 1 does not fit, TP 2 does
    gib = (rows[1]["total_bytes_per_gpu"] + rows[2]["total_bytes_per_gpu"]) / 2 / sizing.USABLE_FRACTION / 2**30
    advice = parallel.replicas_or_tp(path, "bf16", gib, degrees=(2, 4))
    assert advice["choice"] == "tensor parallel" and advice["degree"] == 2 and not advice["fits_one_gpu"]
    assert "smallest tensor-parallel degree that does is 2" in advice["why"]
    tiny = rows[4]["total_bytes_per_gpu"] / sizing.USABLE_FRACTION / 2**30 * 0.5
    nowhere = parallel.replicas_or_tp(path, "bf16", tiny, degrees=(2, 4))
    assert nowhere["choice"] == "does not fit" and nowhere["degree"] is None and "Quantise" in nowhere["why"]


def test_the_default_model_refuses_even_degrees_and_says_so():
    f = fields("SmolLM2-135M-Instruct")
    assert f["heads"] % 2, "SmolLM2 has an odd head count (9): no TP 2, 4 or 8"
    advice = parallel.replicas_or_tp("default", "fp32", 16)
    assert advice["choice"] == "replicas" and "TP 2, 4, 8: vLLM refuses" in advice["why"]


@pytest.mark.parametrize("kwargs, match", [
    ({"dtype": "fp64"}, "unknown dtype"),
    ({"degrees": ()}, "at least one TP degree"),
    ({"degrees": (0, 2)}, "degree=0"),
    ({"context_tokens": 0}, "context_tokens=0"),
    ({"batch": -1}, "batch=-1"),
    ({"gpu_memory_gib": 0}, "gpu_memory_gib=0"),
    ({"gpu": "nope"}, "unknown GPU"),
    ({"gpu": "H100-SXM", "gpu_memory_gib": 80}, "not both"),
])
def test_bad_input_names_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        parallel.tp_plan("default", **kwargs)
    with pytest.raises(ValueError, match="give the GPU"):
        parallel.replicas_or_tp("default", "bf16")
