"""labkit.lessons.findings: the batching lesson's findings choose their words by the numbers."""
from __future__ import annotations

import pytest

from labkit.lessons.nb03 import findings as nb03
from labkit.lessons.nb06 import findings as nb06


def _batching_findings(**over):
    sweep = [{"batch_size": 1, "status": "ok", "total_tokens_per_s": 10.0, "tokens_per_s_per_user": 10.0,
              "ttft_s": 0.1, "agreement": 1.0},
             {"batch_size": 8, "status": "ok", "total_tokens_per_s": 50.0, "tokens_per_s_per_user": 6.25,
              "ttft_s": 0.4, "agreement": 1.0}]
    padding = [{"case": "mixed", "wasted_fraction": 0.6, "ttft_s": 2.0, "agreement": 1.0,
                "samples": {"ttft_s": [1.95, 2.0, 2.05]}},
               {"case": "bucketed", "wasted_fraction": 0.1, "ttft_s": 1.0, "agreement": 1.0,
                "samples": {"ttft_s": [0.98, 1.0, 1.02]}}]
    serving_rows = [{"max_batch_size": 1, "mean_batch_size": 1.0, "output_tokens_per_s": 10.0, "tpot_p50_s": 0.05,
                     "failed": 0},
                    {"max_batch_size": 8, "mean_batch_size": 6.5, "output_tokens_per_s": 40.0, "tpot_p50_s": 0.08,
                     "failed": 0}]
    open_loop = [{"arrivals": "Poisson", "ttft_p90_s": 0.5, "goodput": 1.9, "samples": {"ttft_s": [0.2, 0.3, 0.4, 0.5]}},
                 {"arrivals": "bursty", "ttft_p90_s": 1.5, "goodput": 1.2, "samples": {"ttft_s": [0.9, 1.1, 1.3, 1.5]}}]
    args = dict(sweep=sweep, memory_bound_gain=7.5, padding=padding, serving=serving_rows, open_loop=open_loop,
                clients=8, request_rate=2.0)
    args.update(over)
    return nb06.takeaways(**args)


def _row(b, total, user, ttft=0.1, agreement=1.0, spread=0.02):
    """A sweep row whose samples scatter ±spread around its medians (three rounds)."""
    return {"batch_size": b, "status": "ok", "total_tokens_per_s": total, "tokens_per_s_per_user": user,
            "ttft_s": ttft, "agreement": agreement,
            "samples": {"total_tokens_per_s": [total * (1 - spread), total, total * (1 + spread)],
                        "tokens_per_s_per_user": [user * (1 - spread), user, user * (1 + spread)]}}


def test_batching_findings_choose_their_words_by_the_numbers():
    sweep = [_row(1, 10.0, 10.0), _row(8, 50.0, 6.25, ttft=0.4)]
    text = " ".join(_batching_findings(sweep=sweep).sentences)
    assert "5.0× the total tokens/s" in text and "the memory-bound model allows up to 7.5×" in text
    assert "0.62× batch 1's speed (slower)" in text
    assert "Batching changed no answer" in text and "prefilled faster than the mixed batch (2.00× its speed" in text
    assert "4.0× the tokens/s" in text and "1.6× slower" in text and "3.0× Poisson's; per request, their TTFTs were longer" in text
    # a burst on a busy machine: per-request TTFTs that overlap are within noise, not "better"
    overlap = [{"arrivals": "Poisson", "ttft_p90_s": 1.0, "goodput": 1.0, "samples": {"ttft_s": [0.2, 0.6, 1.0, 1.4]}},
               {"arrivals": "bursty", "ttft_p90_s": 0.3, "goodput": 1.6, "samples": {"ttft_s": [0.1, 0.2, 0.3, 0.9]}}]
    text = " ".join(_batching_findings(sweep=sweep, open_loop=overlap).sentences)
    assert "their TTFTs were within noise (the p10–p90 ranges overlap)" in text and "(better)" not in text
    single_pad = [{k: v for k, v in r.items() if k != "samples"} for r in
                  ({"case": "mixed", "wasted_fraction": 0.6, "ttft_s": 2.0, "agreement": 1.0},
                   {"case": "bucketed", "wasted_fraction": 0.1, "ttft_s": 1.0, "agreement": 1.0})]
    text = " ".join(_batching_findings(sweep=sweep, padding=single_pad).sentences)
    assert "prefilled with no verdict against the mixed batch (2.00× its speed; 1 sample" in text
    sweep = [_row(1, 10.0, 10.0), _row(4, 30.0, 7.5, agreement=0.75)]
    text = " ".join(_batching_findings(sweep=sweep, memory_bound_gain=3.9).sentences)
    assert "3.0× the total tokens/s" in text and "at batch 4 only 75% of the tokens" in text
    with pytest.raises(ValueError, match="two server rows"):
        _batching_findings(serving=[])


def test_the_burst_reveal_names_a_winner_only_when_the_takeaway_does(capsys):
    """The reveal of "which arrivals see the worse TTFT p90" reads the takeaway's verdict: a bursty p90 three times
    Poisson's whose per-request TTFTs overlap is no winner, in the reveal as in the takeaway."""
    from labkit.lessons import exercises

    real = [{"arrivals": "Poisson", "ttft_p90_s": 0.5, "samples": {"ttft_s": [0.2, 0.3, 0.4, 0.5]}},
            {"arrivals": "bursty", "ttft_p90_s": 1.5, "samples": {"ttft_s": [0.9, 1.1, 1.3, 1.5]}}]
    assert nb06.worse_ttft(real)[0] == "bursty"
    swapped = [dict(real[0], samples=real[1]["samples"]), dict(real[1], samples=real[0]["samples"])]
    assert nb06.worse_ttft(swapped)[0] == "Poisson"
    noisy = [{"arrivals": "Poisson", "ttft_p90_s": 0.3, "goodput": 1.0, "samples": {"ttft_s": [0.2, 0.6, 1.0, 1.4]}},
             {"arrivals": "bursty", "ttft_p90_s": 0.9, "goodput": 1.0, "samples": {"ttft_s": [0.1, 0.2, 0.3, 0.9]}}]
    worse, v = nb06.worse_ttft(noisy)
    assert worse is None and v.kind == "within noise"  # the larger p90 (bursty) is not crowned
    row = exercises.reveal_choice("worse TTFT p90", "bursty", worse, ["Poisson", "bursty"],
                                  undecided=f"{v.kind} ({v.reason})")
    out = capsys.readouterr().out
    assert "no winner can be named in this run: within noise (the p10–p90 ranges overlap)" in out
    assert "as you predicted" not in out and row["measured"] is None
    text = " ".join(_batching_findings(open_loop=noisy).sentences)
    assert "their TTFTs were within noise" in text


def test_batching_findings_on_a_busy_machine_say_implausible_not_a_lesson():
    # recorded on a 2-core machine at load 3-8: "Batch 8 gave 25.4× the total tokens/s of batch 1 (more than the
    # memory-bound model's 7.8×); each user got 3.18× batch 1's speed"
    sweep = [_row(1, 0.5, 0.5, spread=0.3), _row(8, 12.7, 1.59, spread=0.3)]
    text = " ".join(_batching_findings(sweep=sweep, memory_bound_gain=7.8).sentences)
    assert "implausible — rerun" in text and "beats its bound 7.80×" in text and "gave 25.4×" not in text
    assert "3.18× batch 1's speed (implausible — rerun" in text
    # one sample each: no verdict, whatever the ratio says
    single = [{k: v for k, v in r.items() if k != "samples"} for r in (_row(1, 10.0, 10.0), _row(8, 50.0, 6.25))]
    text = " ".join(_batching_findings(sweep=single).sentences)
    assert "no verdict" in text and "1 sample" in text and "gave 5.0×" not in text
    # batch 8 below batch 1: a batch cannot lose to one row at a time
    text = " ".join(_batching_findings(sweep=[_row(1, 10.0, 10.0), _row(8, 4.0, 0.5)]).sentences)
    assert "falls below its floor 1.00×" in text


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
