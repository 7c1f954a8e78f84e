"""Notebook 12's measurements and sentences: structured rounds against a live lab server, the table's verdicts, the
P/D bytes ratio and the takeaways' words."""
from __future__ import annotations

import pytest

from labkit.core import verdict
from labkit.lessons.nb12 import runs as nb12_runs
from labkit.lessons.nb12 import findings as nb12
from test_structured import SMALL


def _run(variant, r, rates, valid=8, tokens=40.0, wall=5.0):
    return {"variant": variant, "round": r, "requests": 8, "answered": 8, "valid": valid, "tokens": int(tokens * 8),
            "tokens_per_answer": tokens, "tokens_per_s_per_seq": rates[0], "seq_rates": rates, "wall_s": wall,
            "first_round": r == 0, "example": "{}"}


def test_rounds_on_a_live_server_count_valid_answers_free_and_constrained(server):
    runs = nb12_runs.structured_rounds(server.url, ["Is it?", "Is it so?"], {
        "free": {}, "constrained": {"response_format": nb12_runs.json_schema_format(SMALL)}},
        max_tokens=48, rounds=2, schema=SMALL, model="tiny")
    assert [(r["variant"], r["round"], r["warmup"]) for r in runs[:2]] == [("free", -1, True), ("constrained", -1, True)]
    assert sorted((r["round"], r["variant"]) for r in runs[2:]) == [(0, "constrained"), (0, "free"), (1, "constrained"),
                                                                    (1, "free")], "each round runs both, after a warm-up"
    con = [r for r in runs if r["variant"] == "constrained"]
    free = [r for r in runs if r["variant"] == "free"]
    assert all(r["valid"] == 2 for r in con), con  # a random model held to the grammar: valid every time
    assert all(r["valid"] == 0 for r in free), free  # and without it, never
    bad = nb12_runs.malformed(server.url, nb12_runs.MALFORMED["no json_schema"], model="tiny")
    assert bad["status"] == 400 and bad["param"] == "response_format.json_schema", bad


DRIFT = (1.0, 1.25, 0.8, 1.1, 0.9, 1.2)  # the machine's speed round by round: both variants of a round share it


def test_table_judges_speed_and_wall_time_against_free_paired_by_round():
    warm = [_run("free", -1, [5.0], wall=9.0) | {"warmup": True}, _run("constrained", -1, [4.0], wall=20.0) | {"warmup": True}]
    runs = warm + [x for r, d in enumerate(DRIFT) for x in (
        _run("constrained", r, [8.0 * d, 8.1 * d, 7.9 * d], tokens=30, wall=3.0 / d),
        _run("free", r, [10.0 * d, 10.2 * d, 9.9 * d], valid=1, tokens=60, wall=6.0 / d))]
    table = {row["variant"]: row for row in nb12_runs.structured_table(runs)}
    con = table["constrained"]
    assert con["valid_share"] == 1 and table["free"]["valid_share"] == pytest.approx(6 / 48), "the warm-up not counted"
    assert con["speed_verdict"] == "slower" and con["speed_ratio"] == pytest.approx(0.8) and con["pairs"] == 6
    assert con["speed_why"].startswith("paired sign-flip test, 6 pairs: p = 0.031")
    assert con["wall_verdict"] == "shorter" and con["wall_ratio"] == pytest.approx(0.5)
    assert con["first_wall_s"] == 20.0 and con["rounds"] == 6, "the warm-up batch paid the compile: shown, not a round"
    said = nb12.structured_sentence(con, table["free"], "here")
    assert "48 of 48 constrained" in said and "6 of 48 free" in said and "slower" in said
    pooled = [x for r in runs[2:] if r["variant"] == "constrained" for x in r["seq_rates"]]
    assert verdict.compare(pooled, [x for r in runs[2:] if r["variant"] == "free" for x in r["seq_rates"]]).kind \
        == verdict.NOISE, "pooled over requests, the drift hides the 20 %"
    few = [r for r in runs if r["round"] < 3]
    short = {row["variant"]: row for row in nb12_runs.structured_table(few)}["constrained"]
    assert short["speed_verdict"] == verdict.NO_VERDICT and "3 pairs: a paired test needs at least 6" in short["speed_why"]
    with pytest.raises(ValueError, match="no such variant"):
        nb12_runs.structured_table(runs, base="guided")


def test_a_speed_within_noise_is_never_called_slower():
    runs = [x for r, d in enumerate(DRIFT) for x in (_run("free", r, [10.0 * d, 8.0, 12.0]),
                                                     _run("constrained", r, [10.0 * d * (0.995 + 0.002 * (r % 3)), 8.5]))]
    con = {row["variant"]: row for row in nb12_runs.structured_table(runs)}["constrained"]
    assert con["speed_verdict"] == verdict.NOISE
    assert "slower" not in nb12.structured_sentence(con, con, "here").split("wall time")[0]


def test_valid_needs_the_schema_not_only_json():
    assert nb12_runs.valid('{"answer": "yes", "ok": true}', SMALL)
    assert not nb12_runs.valid('{"answer": "maybe", "ok": true}', SMALL)
    assert nb12_runs.valid('{"answer": "maybe"}', None) and not nb12_runs.valid("```json {}", None)


def test_bytes_ratio_leaves_headers_out():
    split = [{"files": [{"layer0_bytes": 196_696, "header0_bytes": 88, "formula0_bytes": 196_608}]},
             {"files": [{"layer0_bytes": 393_304, "header0_bytes": 88, "formula0_bytes": 393_216}]}, {"files": []}]
    assert nb12_runs.bytes_ratio(split) == 1.0
    assert nb12_runs.bytes_ratio([{"files": []}]) is None


def test_takeaways_headline_and_pd_words():
    stall = {"gain": 50.0, "verdict": "better", "verdict_reason": "3+ samples each"}
    split = [{"identical": True, "recomputed": False}, {"identical": True, "recomputed": True}]
    said = nb12.pd_sentence(split, 1.0, stall)
    assert "2 of 2 answers identical" in said and "loaded the KV of 1 of them" in said and "50.0× shorter" in said
    costly = nb12.pd_sentence(split, 1.0, {**stall, "itl_p50_s": 0.067}, {"itl_p50_s": 0.053})
    assert "1.26× one server's" in costly
    noisy = nb12.pd_sentence(split, None, {**stall, "verdict": verdict.NOISE})
    assert "shorter" not in noisy and verdict.NOISE in noisy
    bytes_row = {"n": 10, "rank": 8, "base_plus_adapters_bytes": 556_492_032, "full_copies_bytes": 5_380_600_320}
    found = nb12.takeaways(lab={"valid_share": 1.0, "speed_ratio": 0.9, "speed_verdict": "within noise"}, vllm_con=None,
                           mask={"mask_ms_per_token": 100.0, "model_ms_per_token": 75.0}, bytes_row=bytes_row,
                           lora=None, lora_gain=None, pd=None, structured=["lab sentence"])
    assert found.headline["label"].startswith("valid JSON") and found.headline["value"] == 1.0
    assert found.sentences[0] == "lab sentence"


def test_a_split_shown_from_the_reference_says_so_and_names_its_machine():
    from labkit.core import results

    ref = results.reference("12_serving_features")
    row = nb12.pd_reference_row(ref, nb12_runs.bytes_ratio(ref.section("pd_split")))
    assert row["sentence"].startswith("The prefill/decode split did not start in this run; from the reference: ")
    assert "AMD EPYC" in row["sentence"] and "this run shows" not in row["sentence"]
    date = ref.env["date"][:10]
    assert row["sentence"].endswith(f"Its stall verdict was judged unpaired, recorded {date} (3 rounds, before rounds "
                                    "were paired).")
    found = nb12.takeaways(lab=None, vllm_con=None, mask={"mask_ms_per_token": 40.0, "model_ms_per_token": 40.0},
                           bytes_row={"n": 2, "rank": 8, "base_plus_adapters_bytes": 1.0, "full_copies_bytes": 2.0},
                           lora=None, lora_gain=None, pd=row)
    assert any("(reference: AMD EPYC" in r["finding"] for r in found.rows)
    assert nb12.pd_reference_row(results.Results("x"), None) is None


def test_a_stall_that_was_not_shorter_claims_no_isolation():
    split = [{"identical": True, "recomputed": False}]
    said = nb12.pd_sentence(split, 1.0, {"gain": 1.1, "verdict": "within noise", "verdict_reason": "overlap"}, None)
    assert "shows no latency isolation" in said and "isolated the short streams" not in said


def test_a_forced_choice_is_the_form_not_the_answer():
    from labkit.decoding import constrained

    said = constrained.form_not_answer("This review is neutral.", "positive", ["positive", "negative", "neutral"])
    assert said.startswith("a mask guarantees the form, not the answer") and "'neutral'" in said and "'positive'" in said
    plain = constrained.form_not_answer("I think so.", "positive", ["positive", "negative", "neutral"])
    assert "one of the choices by construction" in plain


def test_too_few_pairs_show_the_full_mode_references_verdicts_beside_and_how_they_were_judged():
    """Quick mode runs 3 rounds on vLLM: "no verdict (3 pairs)", and beside it the reference's verdicts, read from
    the shipped file, by the rule they were recorded under (unpaired, before rounds were paired) and its date."""
    from labkit.core import results

    ref = results.reference("12_serving_features")
    runs = [x for r, d in enumerate(DRIFT[:3]) for x in (_run("constrained", r, [8.0 * d], wall=3.0 / d),
                                                          _run("free", r, [10.0 * d], wall=6.0 / d))]
    con = {row["variant"]: row for row in nb12_runs.structured_table(runs)}["constrained"]
    said = nb12.structured_beside_reference(con, ref)
    row = next(r for r in ref.section("vllm_structured") if r["variant"] == "constrained")
    assert said.startswith("This run: no verdict (3 pairs), too few pairs for the paired test. The full-mode reference "
                           f"(judged unpaired, recorded {ref.env['date'][:10]}, {row['rounds']} rounds): constrained "
                           f"tokens/s per sequence {row['speed_ratio']:.2f}× the free one's ({row['speed_verdict']})")
    six = [x for r, d in enumerate(DRIFT) for x in (_run("constrained", r, [8.0 * d]), _run("free", r, [10.0 * d]))]
    assert nb12.structured_beside_reference({row["variant"]: row for row in nb12_runs.structured_table(six)}
                                            ["constrained"], ref) == "", "six pairs decide: nothing beside"
    modes = {r["mode"]: r for r in ref.section("lora_modes")}
    few = {"mixed": verdict.compare([1.0, 1.1, 0.9], [2.0, 2.2, 1.8], paired=True)}
    base, mixed = modes["base"]["samples"]["tokens_per_s"], modes["mixed"]["samples"]["tokens_per_s"]
    old = verdict.compare(mixed, base)
    assert nb12.lora_beside_reference(few, ref).endswith(f"mixed {old.ratio:.2f}× the base ({old.label}).")
    assert nb12.lora_beside_reference({"mixed": verdict.compare([1.0] * 6, [2.0] * 6, paired=True)}, ref) == ""
