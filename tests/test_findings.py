"""labkit.lessons.findings: the quantisation lesson's findings choose their words by the numbers (notebook 06's:
tests/test_nb06_paired.py)."""
from __future__ import annotations

import pytest

from labkit.lessons.nb03 import findings as nb03


ROUNDS6 = (0.98, 1.0, 1.02, 0.99, 1.01, 1.0)  # six rounds' load, shared by every variant timed in them
WALK = (0.85, 1.15, 0.9, 1.1, 0.95, 1.05, 0.88, 1.12)  # a machine drifting ±15 % between rounds
JITTER = (1.004, 0.996, 1.0, 1.003, 0.997, 1.0, 1.002, 0.998)  # what one pass adds of its own


def _rounds(x, load=ROUNDS6, own=None):
    """x in rounds that share the machine's ``load`` (one factor a round), times each pass's ``own`` jitter."""
    return [x * f * g for f, g in zip(load, own or [1.0] * len(load))]


def _quant_table(int8_speed, int8_samples=None, fp32_samples=None):
    import pandas as pd

    def row(v, bytes_, speed, samples, ppl, agreement=0.9, kl=0.05):
        return {"variant": v, "status": "ok", "weight_bytes": bytes_, "decode_tokens_per_s": speed, "perplexity": ppl,
                "agreement": agreement, "kl": kl, "samples": {"decode_tokens_per_s": list(samples)}}
    fp32_samples = fp32_samples or _rounds(10.0)
    load = ROUNDS6 if len(fp32_samples) == len(ROUNDS6) else WALK[:len(fp32_samples)]
    rows = [row("fp32", 540e6, 10.0, fp32_samples, 20.0, 1.0, 0.0),
            row("bnb-int8", 170e6, 4.0, _rounds(4.0, load), 20.2),
            row("ort-fp32", 540e6, 10.0, fp32_samples, 20.0),
            row("ort-int8-tensor", 162e6, int8_speed, int8_samples or _rounds(int8_speed, load), 26.0)]
    return pd.DataFrame(rows).set_index("variant")


def _quant(table):
    import pandas as pd

    hand = pd.DataFrame({"output_error": {"per-tensor": 0.02, "per-channel": 0.01, "nf4": 0.05},
                         "fraction_of_fp32": {"per-tensor": 0.25, "per-channel": 0.26, "nf4": 0.14}})
    layers = pd.DataFrame([{"layer": "0", "form": "per-tensor", "relative_error": 0.08},
                           {"layer": "27", "form": "per-tensor", "relative_error": 0.31}])
    return nb03.takeaways(table=table, hand=hand, agree=pd.DataFrame(), routes={}, layer_error={},
                                 claims=pd.DataFrame(), layers=layers)


def test_fastest_int8_is_compared_within_fp32s_device():
    """On a GPU, ONNX Runtime's int8 rows run on the CPU provider beside fp32 on the GPU: the "fastest int8 / fp32"
    takeaway compares rows of one device, or names both devices."""
    table = _quant_table(19.0)
    table["device"] = {"fp32": "cuda", "bnb-int8": "cuda", "ort-fp32": "cuda:0", "ort-int8-tensor": "cpu"}
    found = _quant(table)
    label = found.rows[0]["finding"]
    assert "bnb-int8" in label and "ort-int8" not in label and "cuda" in label, label
    assert found.rows[0]["value"] == pytest.approx(0.4)
    text = " ".join(found.sentences)
    assert "The fastest int8 variant here on cuda, bnb-int8," in text
    only_cpu = table.drop(index="bnb-int8")  # no int8 row on the GPU: the other device's, with both devices named
    fast, label = nb03.fastest_int8(only_cpu)
    assert fast == "ort-int8-tensor" and "on cpu" in label and "on cuda" in label and "different devices" in label
    assert "fp32 ran on cuda" in " ".join(_quant(only_cpu).sentences)


def test_quantisation_speed_sentence_follows_the_verdict():
    # recorded busy run: "ort-int8-tensor decoded 12.28× fp32's speed" from one 8-token run (bytes cap it near 3.3×)
    text = " ".join(_quant(_quant_table(122.8)).sentences)
    assert "12.28× ort-fp32's speed: implausible — rerun" in text and "beats its bound 3.33×" in text
    text = " ".join(_quant(_quant_table(19.0)).sentences)  # quiet: 1.90×, inside the bytes bound
    assert "decoded 1.90× ort-fp32's speed (faster than ort-fp32)" in text
    text = " ".join(_quant(_quant_table(10.1, int8_samples=_rounds(10.1, own=JITTER))).sentences)
    assert "1.01× ort-fp32's speed, within noise (paired sign-flip test, 6 pairs" in text and "faster than" not in text
    # why ONNX Runtime int8 costs perplexity: read from the per-layer errors of the form that ran
    assert "raised it +30.0%" in text and "+1.0%" in text
    assert "In the form it ran (per-tensor), on layer 0 its output error was 0.080, 8.0× the 0.010" in text
    assert "its worst probed layer reached 0.310 (layer 27)" in text


def test_int8_speed_is_judged_paired_round_by_round():
    """int8 1.9× its engine's fp32 in every round, on a machine drifting ±15 % between rounds: "faster" paired (the
    unpaired rule reads the same figures the same way only where the ranges part); 8.6 % faster through that drift,
    the unpaired rule says "within noise", the paired test "faster"; three rounds are no verdict (3 pairs)."""
    from labkit.core import verdict

    fp32 = _rounds(10.0, WALK)
    small = _rounds(10.86, WALK, JITTER)
    assert verdict.compare(small, fp32).kind == verdict.NOISE  # the old rule, on the same rounds
    text = " ".join(_quant(_quant_table(10.86, int8_samples=small, fp32_samples=fp32)).sentences)
    assert "decoded 1.09× ort-fp32's speed (faster than ort-fp32)" in text
    three = _quant(_quant_table(19.0, int8_samples=_rounds(19.0, WALK[:3]), fp32_samples=fp32[:3]))
    assert three.rows[0]["verdict"] == verdict.NO_VERDICT
    assert "1.90× ort-fp32's speed, no verdict (3 pairs: a paired test needs at least 6" in " ".join(three.sentences)
    assert "no verdict (3 pairs)" == nb03.int8_verdict(_quant_table(19.0, int8_samples=_rounds(19.0, WALK[:3]),
                                                                     fp32_samples=fp32[:3]), "ort-int8-tensor").label


def test_int8_is_judged_against_its_own_engines_fp32_and_the_engine_gain_said_apart():
    """A recorded run: ONNX Runtime's int8 decoded 2.51× PyTorch fp32 while ONNX Runtime's fp32 ran 1.62× PyTorch:
    int8's share is 1.55×; the headline says that, and the engine's gain is a sentence of its own."""
    table = _quant_table(25.1)
    table.loc["ort-fp32", "decode_tokens_per_s"] = 16.2
    table.at["ort-fp32", "samples"] = {"decode_tokens_per_s": _rounds(16.2)}
    found = _quant(table)
    assert found.rows[0]["finding"].endswith("decode / ort-fp32") and found.rows[0]["value"] == pytest.approx(1.549, abs=1e-3)
    text = " ".join(found.sentences)
    assert "ort-int8-tensor, decoded 1.55× ort-fp32's speed (faster than ort-fp32)" in text
    assert "ort-fp32 against PyTorch fp32, decoded 1.62× PyTorch's speed (faster)" in text and "not int8's" in text
    assert nb03.int8_base(table, "bnb-int8") == "fp32", "bitsandbytes runs inside PyTorch"
    table.loc["ort-fp32", "status"] = "failed here"
    assert nb03.int8_base(table, "ort-int8-tensor") == "fp32"


def test_ort_perplexity_is_explained_by_the_form_that_ran():
    """The variants ran reduce_range (7-bit per-channel): the saturating 8-bit form's 5.2 on layer 9 is not theirs."""
    import pandas as pd

    table = _quant_table(19.0)
    table.loc["ort-int8-tensor", "status"] = "skipped"
    table.loc["ort-int8-channel"] = table.loc["bnb-int8"]
    table["options"] = pd.Series([{} for _ in table.index], index=table.index, dtype=object)
    table.at["ort-int8-channel", "options"] = {"per_channel": True, "reduce_range": True}
    table.loc["ort-int8-channel", "perplexity"] = 24.0
    layers = pd.DataFrame([{"layer": "0", "form": "per-channel, 8-bit", "relative_error": 0.006},
                           {"layer": "9", "form": "per-channel, 8-bit", "relative_error": 5.208},
                           {"layer": "0", "form": "per-channel, 7-bit", "relative_error": 0.185},
                           {"layer": "9", "form": "per-channel, 7-bit", "relative_error": 0.12}])
    hand = pd.DataFrame({"output_error": {"per-tensor": 0.02, "per-channel": 0.01, "nf4": 0.05},
                         "fraction_of_fp32": {"per-tensor": 0.25, "per-channel": 0.26, "nf4": 0.14}})
    text = " ".join(nb03.takeaways(table=table, hand=hand, agree=pd.DataFrame(), routes={}, layer_error={},
                                   claims=pd.DataFrame(), layers=layers).sentences)
    assert "In the form it ran (per-channel, 7-bit), on layer 0 its output error was 0.185, 18.5× the 0.010" in text
    assert "5.208" not in text and "worst probed layer reached 0.185 (layer 0)" in text
    assert nb03.ort_form(table, "ort-int8-channel") == "per-channel, 7-bit"
    table.at["ort-int8-channel", "options"] = {"per_channel": True, "reduce_range": False}
    assert nb03.ort_form(table, "ort-int8-channel") == "per-channel, 8-bit"
    assert "did not run ort-int8-channel's form" in " ".join(nb03.takeaways(
        table=table, hand=hand, agree=pd.DataFrame(), routes={}, layer_error={}, claims=pd.DataFrame(),
        layers=layers.assign(form="per-tensor")).sentences), "a probe of other forms says nothing about this one"


def _forms_table(kl_tensor, kl_channel, tokens_per_prompt=12):
    import pandas as pd

    def row(v, kls):
        return {"variant": v, "status": "ok", "agreement": 1.0, "kl": sum(kls) / len(kls), "kl_per_prompt": list(kls),
                "kl_tokens": tokens_per_prompt * len(kls)}
    return pd.DataFrame([row("ort-int8-tensor", kl_tensor), row("ort-int8-channel", kl_channel)]).set_index("variant")


def test_per_tensor_against_per_channel_says_quick_mode_has_too_few_tokens():
    """Recorded in quick mode (2 prompts × 12 tokens): both forms agreed 100%, KL 0.021 and 0.018: a flat demo. The
    sentence says the comparison is within noise and why, and only a real difference gets the word 'lower'."""
    quick = nb03.forms_sentence(_forms_table([0.020, 0.022], [0.017, 0.019]), quick=True)
    assert "over 2 prompts × 12 tokens" in quick and "no verdict (2 samples" in quick
    assert "Quick mode scores 24 tokens in all: too few" in quick and "lower" not in quick
    full = nb03.forms_sentence(_forms_table([0.05, 0.06, 0.07, 0.08], [0.010, 0.012, 0.013, 0.015]), quick=False)
    assert "lower (4+ samples each" in full and "Quick mode" not in full and "0.19× per-tensor's" in full
    overlap = nb03.forms_sentence(_forms_table([0.01, 0.05, 0.09], [0.02, 0.04, 0.08]), quick=False)
    assert "within noise (the p10–p90 ranges overlap): on these prompts the two forms cannot be told apart" in overlap
    assert nb03.forms_sentence(_forms_table([0.02], [0.01]).drop(index="ort-int8-tensor")) == ""


def _claims(change, claim=-0.75, share=0.2105, tied=True, variant="ort-int8-channel"):
    import pandas as pd

    return pd.DataFrame([{"variant": variant, "claim": "INT8", "memory_change": change, "memory_claim": claim,
                          "memory_holds": abs(change - claim) <= 0.05, "perplexity_rise": 0.01, "loss_claim": 0.03,
                          "accuracy_holds": True, "embedding_share": share, "tied_embedding": tied}])


def test_a_missed_memory_claim_names_the_tied_embedding_and_its_share():
    """SmolLM2 ties its embedding to lm_head (21% of its weights); ONNX Runtime's int8 measured -69% against the
    claimed -75%: the sentence says what the embedding's 2 bytes a weight make of the claim, from the share."""
    import pandas as pd

    table = _quant_table(19.0)
    hand = pd.DataFrame({"output_error": {"per-tensor": 0.02, "per-channel": 0.01, "nf4": 0.05},
                         "fraction_of_fp32": {"per-tensor": 0.25, "per-channel": 0.26, "nf4": 0.14}})

    def said(claims):
        return " ".join(nb03.takeaways(table=table, hand=hand, agree=pd.DataFrame(), routes={}, layer_error={},
                                       claims=claims).sentences)
    text = said(_claims(-0.69))
    assert "INT8 memory (ort-int8-channel): -69% against the claimed -75%" in text
    assert "one matrix holding 21% of the weights" in text and "-70% at best, which the measured -69% matches" in text
    assert "further off still" in said(_claims(-0.55))
    assert "ties its input embedding" not in said(_claims(-0.74)), "a claim that held needs no reason"
    assert "ties its input embedding" not in said(_claims(-0.69, tied=False))
    assert nb03.embedding_kept_change(-0.50, 0.21) == pytest.approx(-0.50), "fp16 halves the embedding too"


def test_a_load_peak_is_labelled_apart_from_decoding_with_its_cause():
    """The recorded quick run: fp16 733 MiB loading against 282 decoding, bnb-int8 832 against 326; fp32's
    memory-mapped checkpoint peaks while decoding."""
    import pandas as pd

    mib = 2**20
    table = pd.DataFrame([{"variant": "ort-int8-channel", "status": "ok", "prepare_s": 14.0,
                           "load_peak_memory_bytes": 900 * mib, "run_peak_memory_bytes": 300 * mib},
                          {"variant": "fp16", "status": "ok", "prepare_s": None,
                           "load_peak_memory_bytes": 733 * mib, "run_peak_memory_bytes": 282 * mib},
                          {"variant": "bnb-int8", "status": "ok", "prepare_s": None,
                           "load_peak_memory_bytes": 832 * mib, "run_peak_memory_bytes": 326 * mib},
                          {"variant": "fp32", "status": "ok", "prepare_s": None,
                           "load_peak_memory_bytes": 42 * mib, "run_peak_memory_bytes": 542 * mib}]).set_index("variant")
    text = nb03.peak_sentence(table)
    assert text.startswith("Peaks from the load, not from decoding: ort-int8-channel 900 MiB while loading against 300")
    assert "exported or quantised the model now (14 s, once" in text
    assert "fp16 733 MiB while loading against 282 MiB while decoding (the fp32 checkpoint is read and cast" in text
    assert "bitsandbytes quantises the weights in memory at every load" in text and "fp32" not in text.split("(")[0]
    assert "fp32 42" not in text
    quiet = table.assign(load_peak_memory_bytes=100 * mib, run_peak_memory_bytes=500 * mib)
    assert nb03.peak_sentence(quiet).startswith("Every variant peaked while decoding")


def test_worst_layer_errors_within_slack_tie_instead_of_naming_a_winner():
    """The recorded quick run: per-channel 7-bit 0.185 against per-tensor 0.190 (one sample a layer) is a tie;
    the saturating 8-bit form's 5.208 stays apart."""
    import pandas as pd

    def said(errors):
        found = nb03.takeaways(table=_quant_table(20.0), hand=pd.DataFrame({"output_error": {"per-tensor": 0.02, "per-channel": 0.01, "nf4": 0.05},
                                                                  "fraction_of_fp32": {"per-tensor": 0.25, "per-channel": 0.26, "nf4": 0.14}}),
                               agree=pd.DataFrame(), routes={}, layer_error=errors, claims=pd.DataFrame(),
                               layers=pd.DataFrame())
        return " ".join(found.sentences)

    tie = said({"per-channel, 7-bit": 0.185, "per-channel, 8-bit": 5.208, "per-tensor": 0.190})
    assert "worst-layer errors of per-channel, 7-bit and per-tensor tie (0.185, 0.190" in tie
    assert "per-channel, 8-bit 5.208" in tie and "lowest worst-layer error came from" not in tie
    apart = said({"per-channel, 7-bit": 0.05, "per-tensor": 0.19})
    assert "lowest worst-layer error came from per-channel, 7-bit (0.050, against per-tensor 0.190)" in apart


def test_bitsandbytes_int8_speed_is_explained_by_its_verdict():
    """bnb-int8 at 0.4× fp32 (the AVX2 machines): the passes LLM.int8 adds; faster where the int8 matmul outran them."""
    slow = nb03.bnb_int8_speed(_quant_table(20.0))
    assert "0.40× fp32's speed (slower)" in slow and "to save GPU memory, not time" in slow
    fast_table = _quant_table(20.0)
    fast_table.at["bnb-int8", "samples"] = {"decode_tokens_per_s": _rounds(14.0)}
    fast_table.at["bnb-int8", "decode_tokens_per_s"] = 14.0
    assert "outran the passes" in nb03.bnb_int8_speed(fast_table)
    assert nb03.bnb_int8_speed(_quant_table(20.0).drop(index="bnb-int8")) == ""
