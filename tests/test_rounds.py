"""labkit.precision.rounds: decode speeds re-timed in interleaved rounds; a variant that cannot be loaded again
keeps no speed and says why."""
from __future__ import annotations

from labkit.precision import rounds, variants
from labkit.precision.measure import Inputs, Settings
from labkit.precision.variants import Variant


def test_retime_interleaves_and_marks_a_variant_that_fails_to_reload(tiny_llama, monkeypatch):
    model, tok = tiny_llama

    def load(name, *a, **kw):
        if name == "fp16":
            return Variant(name, status="cannot run here: out of memory")
        return Variant(name, model=model, tokenizer=tok, backend="torch")

    monkeypatch.setattr(variants, "load_variant", load)
    rows = [{"variant": "fp32", "status": "ok", "decode_tokens_per_s": 1.0},
            {"variant": "fp16", "status": "ok", "decode_tokens_per_s": 9.0},
            {"variant": "bf16", "status": "ok", "decode_tokens_per_s": 2.0}]
    inputs = Inputs(reference=None, eval_ids=[], questions=[], settings=Settings(new_tokens=10, repeats=3))
    drift = rounds.retime(rows, inputs)
    fp32, fp16, bf16 = rows
    assert fp16["status"].startswith("failed while measuring") and "out of memory" in fp16["status"]
    assert fp16["decode_tokens_per_s"] is None  # the first pass's figure is not kept beside the others
    # one figure per round on each side (round i at index i): the baseline's extra pass for drift is not a round
    assert len(fp32["samples"]["decode_tokens_per_s"]) == len(bf16["samples"]["tpot_s"]) == 3
    assert fp32["timed"] == bf16["timed"] == "interleaved rounds"
    assert drift == fp32["drift"] == bf16["drift"] and drift > 0


def test_rounded_weight_rows_are_never_timed(tiny_llama, monkeypatch):
    """A rounded-weight variant computes in fp32: the rounds load and time only the others, and its row keeps no
    speed, so fp32's figure never appears under a format's name."""
    model, tok = tiny_llama
    loaded = []

    def load(name, *a, **kw):
        loaded.append(name)
        return Variant(name, model=model, tokenizer=tok, backend="torch")

    monkeypatch.setattr(variants, "load_variant", load)
    rows = [{"variant": "fp32", "status": "ok", "decode_tokens_per_s": 1.0},
            {"variant": "nvfp4", "status": "ok", "decode_tokens_per_s": None}]
    inputs = Inputs(reference=None, eval_ids=[], questions=[], settings=Settings(new_tokens=6, repeats=2))
    rounds.retime(rows, inputs)
    assert loaded == ["fp32"]
    assert rows[1]["decode_tokens_per_s"] is None and "samples" not in rows[1]
    assert rows[0]["timed"] == "interleaved rounds"
