"""LoRA adapters for "many adapters, one model": the byte arithmetic against the file PEFT writes, reuse of a
folder already written, vLLM's multi-LoRA flags, and an adapter's greedy answers against the base's."""
from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from labkit.model import adapters as ad
from labkit.serve.vllm import lora

RANK = 4


@pytest.fixture(scope="module")
def tiny_dir(tiny_llama, tmp_path_factory):
    """The tiny random Llama (2 layers, hidden 64, 4 heads, 2 KV heads of 16) saved as a model directory."""
    model, tok = tiny_llama
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def written(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapters")
    return ad.make_adapters(str(tiny_dir), out, ["alpha", "beta"], rank=RANK, alpha=8)


def test_adapter_bytes_are_the_tensors_of_the_file_written(tiny_llama, written):
    model, _ = tiny_llama
    # by hand: 2 layers x (q: 4 x (64 + 64) + v: 4 x (64 + 32)) numbers x 4 bytes
    assert ad.adapter_bytes(model.config, RANK, ("q_proj", "v_proj"), "fp32") == 2 * (4 * 128 + 4 * 96) * 4 == 7168
    for folder in written.values():
        weights = folder / ad.WEIGHTS_FILE
        assert ad.weights_bytes(weights) == 7168
        with safe_open(str(weights), "pt") as f:  # the header's offsets are the tensors' real sizes
            assert sum(f.get_tensor(k).numel() * 4 for k in f.keys()) == 7168
            assert len(list(f.keys())) == 2 * 2 * 2  # layers x targets x (A, B)
        header = weights.stat().st_size - 7168
        assert 0 < header < 4096, f"the file is the tensors plus a small header, not {header} bytes more"


def test_every_target_shape_matches_peft(tiny_llama, tiny_dir, tmp_path):
    model, _ = tiny_llama
    folder = ad.make_adapters(str(tiny_dir), tmp_path, ["every"], rank=2, targets=ad.TARGETS)["every"]
    assert ad.weights_bytes(folder) == ad.adapter_bytes(model.config, 2, ad.TARGETS, "fp32")


def test_n_adapters_against_n_copies(tiny_llama):
    config = tiny_llama[0].config
    row = ad.n_adapters_vs_copies(10, config, rank=RANK)
    one = ad.adapter_bytes(config, RANK)
    assert row["adapter_bytes"] == one
    assert row["base_plus_adapters_bytes"] == row["base_bytes"] + 10 * one
    assert row["full_copies_bytes"] == 10 * row["base_bytes"]
    assert row["base_bytes"] == sum(p.numel() for p in tiny_llama[0].parameters()) * 4  # tied: counted once
    assert row["saving"] == pytest.approx(10 * row["base_bytes"] / (row["base_bytes"] + 10 * one))


def test_an_adapter_folder_whose_recipe_matches_is_reused(tiny_dir, written):
    stamps = {n: (f / ad.WEIGHTS_FILE).stat().st_mtime_ns for n, f in written.items()}
    again = ad.make_adapters(str(tiny_dir), next(iter(written.values())).parent, ["alpha", "beta"], rank=RANK, alpha=8)
    assert again == written
    assert {n: (f / ad.WEIGHTS_FILE).stat().st_mtime_ns for n, f in again.items()} == stamps


def test_a_changed_recipe_rewrites_the_folder(tiny_dir, tmp_path):
    first = ad.make_adapters(str(tiny_dir), tmp_path, ["one"], rank=RANK)["one"]
    assert json.loads((first / ad.CONFIG_FILE).read_text())["r"] == RANK
    ad.make_adapters(str(tiny_dir), tmp_path, ["one"], rank=2)
    assert json.loads((first / ad.CONFIG_FILE).read_text())["r"] == 2
    assert json.loads((first / ad.RECIPE).read_text())["rank"] == 2


def test_adapters_differ_from_each_other(written):
    with safe_open(str(written["alpha"] / ad.WEIGHTS_FILE), "pt") as a, \
            safe_open(str(written["beta"] / ad.WEIGHTS_FILE), "pt") as b:
        key = next(k for k in a.keys() if "lora_B" in k)
        assert a.get_tensor(key).abs().sum() > 0, "B is zero: the adapter would change nothing"
        assert not a.get_tensor(key).equal(b.get_tensor(key))


@pytest.mark.parametrize("kwargs, fix", [({"names": ["a", "a"]}, "distinct"), ({"names": ["my-lora"]}, "identifiers"),
                                         ({"targets": ("qkv",)}, "choose from"), ({"strength": 2.0}, "(0, 1]"),
                                         ({"train_steps": -1}, "positive number")])
def test_bad_input_names_the_fix(tmp_path, kwargs, fix):
    args = {"names": ["a"], **kwargs}
    with pytest.raises(ValueError, match=fix.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ad.make_adapters("unused", tmp_path, **args)


def test_merged_greedy_differs_from_the_base(tiny_llama, tiny_dir, written):
    _, tok = tiny_llama
    prompts = [tok("The sky is", add_special_tokens=False)["input_ids"], tok("One, two,", add_special_tokens=False)["input_ids"]]
    table = ad.greedy_table(str(tiny_dir), written, prompts, 8)
    assert [len(a) for a in table["base"]] == [8, 8]
    assert table["alpha"] != table["base"] and table["beta"] != table["base"] and table["alpha"] != table["beta"]
    assert ad.merged_greedy(str(tiny_dir), written["alpha"], prompts, 8) == table["alpha"]  # deterministic


def test_lora_args_for_vllm(written):
    args = lora.lora_args(written)
    assert args == ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--lora-modules",
                    f"alpha={written['alpha'].resolve()}", f"beta={written['beta'].resolve()}")
    assert lora.lora_args(written, max_loras=1, max_rank=16)[1:5] == ("--max-loras", "1", "--max-lora-rank", "16")


def test_lora_args_json_form_and_bad_ranks(written, tmp_path):
    odd = tmp_path / "a,b=c"
    odd.mkdir()
    (odd / ad.CONFIG_FILE).write_text(json.dumps({"r": 16}))
    module = lora.lora_args({"odd": odd})[-1]
    assert json.loads(module) == {"name": "odd", "path": str(odd.resolve())}
    assert lora.lora_args({"odd": odd})[4] == "16"
    with pytest.raises(ValueError, match="one of"):
        lora.lora_args(written, max_rank=12)
    with pytest.raises(ValueError, match="max_rank >= 16"):
        lora.lora_args({"odd": odd}, max_rank=8)
    with pytest.raises(ValueError, match="not a PEFT adapter config"):
        lora.lora_args({"none": tmp_path})


def test_a_seeded_adapter_moves_each_weight_by_its_strength(tiny_llama, written):
    model, _ = tiny_llama
    weight = model.model.layers[1].self_attn.v_proj.weight
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_{}.weight"
    with safe_open(str(written["beta"] / ad.WEIGHTS_FILE), "pt") as f:
        delta = (8 / RANK) * f.get_tensor(key.format("B")) @ f.get_tensor(key.format("A"))  # alpha / r
    assert float(delta.norm() / weight.norm()) == pytest.approx(ad.DEFAULT_STRENGTH, rel=1e-4)


def test_lora_modes_are_judged_paired_round_by_round():
    """Each round's tokens/s of a mode against the base's of the same round: a drift both share cancels; a round
    either measured nothing in drops out; fewer than 6 pairs is no verdict."""
    from labkit.core import verdict

    drift = [1.0, 1.3, 0.8, 1.2, 0.9, 1.1, 1.25]
    base = {"mode": "base", "samples": {"tokens_per_s": [100.0 * d for d in drift]}}
    mixed = {"mode": "mixed", "samples": {"tokens_per_s": [90.0 * d for d in drift[:-1]] + [None]}}
    v = lora.paired_verdict(mixed, base)
    assert v.paired and v.n == 6 and v.kind == verdict.WORSE and v.ratio == pytest.approx(0.9)
    assert verdict.compare([x for x in mixed["samples"]["tokens_per_s"] if x], base["samples"]["tokens_per_s"]).kind \
        == verdict.NOISE, "unpaired, the drift hides the 10 %"
    few = {"mode": "one", "samples": {"tokens_per_s": [90.0 * d for d in drift[:3]] + [None] * 4}}
    assert lora.paired_verdict(few, base).label == "no verdict (3 pairs)"
    assert lora.paired_verdict({"mode": "one", "samples": {"tokens_per_s": [None] * 7}}, base).label \
        == "no verdict (0 pairs)"
    with pytest.raises(ValueError, match="one value per round"):
        lora.paired_verdict({"mode": "one", "samples": {"tokens_per_s": [90.0] * 3}}, base)


def test_lora_rounds_warm_up_each_mode_then_keep_each_rounds_figure_at_its_index(monkeypatch):
    from types import SimpleNamespace

    sent = []

    def fake_send(url, prompts, max_tokens, concurrency, models):
        sent.append(tuple(models))
        out = SimpleNamespace(success=True, output_tokens=max_tokens, ttft_s=0.1, error=None)
        return [out] * len(prompts), 0.5 * (2 if models[0] != "base" else 1)

    monkeypatch.setattr(lora, "served_models", lambda url: {"base": "base", "adapters": ["alpha", "beta"]})
    monkeypatch.setattr(lora.client, "send_ids", fake_send)
    server = SimpleNamespace(url="http://x")
    rows = {r["mode"]: r for r in lora.lora_rounds(server, ["alpha", "beta"], [[1], [2]], 4, 2, rounds=6)}
    assert len(sent) == 3 + 18, "one warm-up pass per mode, then six rounds of three"
    assert all(len(r["samples"]["tokens_per_s"]) == 6 for r in rows.values())
    v = lora.paired_verdict(rows["mixed"], rows["base"])
    assert v.paired and v.n == 6 and v.ratio == pytest.approx(0.5)
    sent.clear()
    lora.lora_rounds(server, ["alpha", "beta"], [[1], [2]], 4, 2, rounds=2, warmup=False)
    assert len(sent) == 6, "a server already warm: no warm-up pass"
