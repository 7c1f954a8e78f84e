"""labkit.serve.experiments.batching: padding, the Pareto front, the static sweep (with its oom rows and agreement), the
batched step's inputs, the memory-bound gain and TGI's batching options."""
from __future__ import annotations

import pytest
import torch

from labkit.decoding import generation
from labkit.serve.experiments import batching

# ------------------------------------------------------------------------------------------ pure logic


def test_padding_stats_counts_wasted_tokens():
    s = batching.padding_stats([10, 4, 6])
    assert s["padded_tokens"] == 30 and s["real_tokens"] == 20 and s["pad_tokens"] == 10
    assert s["wasted_fraction"] == pytest.approx(1 / 3)
    assert batching.padding_stats([5, 5])["pad_tokens"] == 0


@pytest.mark.parametrize("lengths", [[], [3, 0]])
def test_padding_stats_rejects_bad_lengths(lengths):
    with pytest.raises(ValueError, match="at least one"):
        batching.padding_stats(lengths)


def test_pareto_front_keeps_only_undominated_rows():
    rows = [{"batch_size": 1, "total_tokens_per_s": 10, "tokens_per_s_per_user": 10},
            {"batch_size": 2, "total_tokens_per_s": 18, "tokens_per_s_per_user": 9},
            {"batch_size": 3, "total_tokens_per_s": 15, "tokens_per_s_per_user": 5},  # beaten by batch 2
            {"batch_size": 4, "status": "oom"}]
    assert [r["batch_size"] for r in batching.pareto_front(rows)] == [1, 2]


# ------------------------------------------------------------------------------------------- the sweep


def test_static_sweep_rows_and_oom_row(tiny_llama, monkeypatch):
    model, tok = tiny_llama
    real = generation.generate

    def flaky(model_, tok_, prompts, **kw):
        if isinstance(prompts, list) and len(prompts) == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model_, tok_, prompts, **kw)

    monkeypatch.setattr(generation, "generate", flaky)
    rows = batching.static_sweep(model, tok, batch_sizes=[1, 2, 4], new_tokens=3, progress=False)
    assert [r["batch_size"] for r in rows] == [1, 2, 4]
    assert [r["status"] for r in rows] == ["ok", "oom", "ok"]  # the sweep went on after the oom
    ok = rows[2]
    assert ok["n_out"] == 3 and ok["ttft_s"] <= ok["latency_s"]
    assert ok["total_tokens_per_s"] == pytest.approx(4 * ok["tokens_per_s_per_user"])
    fig = batching.pareto_figure(rows)
    assert list(fig.data[0].x) == [rows[0]["total_tokens_per_s"], ok["total_tokens_per_s"]]


def test_static_sweep_passes_other_errors_through(tiny_llama, monkeypatch):
    model, tok = tiny_llama
    monkeypatch.setattr(generation, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        batching.static_sweep(model, tok, batch_sizes=[1], new_tokens=2, progress=False)
    with pytest.raises(ValueError, match="batch size"):
        batching.static_sweep(model, tok, batch_sizes=[0], new_tokens=2, progress=False)


def test_default_batch_sizes_grow_on_gpu_only():
    assert batching.default_batch_sizes("cpu") == (1, 2, 4, 8, 16)
    gpu = batching.default_batch_sizes("cuda")
    assert gpu[:5] == (1, 2, 4, 8, 16) and gpu[-1] == batching.GPU_MAX_BATCH


def test_padding_experiment_counts_and_times(tiny_llama):
    model, tok = tiny_llama
    rows = batching.padding_experiment(model, tok, batch=3, new_tokens=2, long_repeat=1)
    cases = {r["case"]: r for r in rows}
    mixed, short = cases["mixed (padded to longest)"], cases["short prompts only"]
    assert mixed["pad_tokens"] > short["pad_tokens"] and mixed["wasted_fraction"] > 0.3
    bucketed = cases["bucketed (short batch, then long alone)"]
    assert bucketed["real_tokens"] == mixed["real_tokens"] and bucketed["padded_tokens"] < mixed["padded_tokens"]


# ------------------------------------------------------------------------------ the batched step, quality


def test_step_inputs_grow_the_mask_and_count_real_tokens():
    mask = torch.tensor([[1, 1, 1], [0, 0, 1], [0, 1, 1]])
    grown, pos = batching.step_inputs(mask)
    assert grown.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]]
    assert pos.tolist() == [3, 1, 2]  # a row with n real tokens puts the new one at position n


def test_step_inputs_drive_a_batched_step_like_each_prompt_alone(tiny_llama):
    """One prefill and one step on a left-padded batch give each prompt the tokens it gets alone."""
    from labkit.decoding import decode

    model, tok = tiny_llama
    prompts = [[11, 12, 13, 14, 15], [21, 22], [31, 32, 33]]
    ids, mask = decode.left_pad(prompts, tok.pad_token_id, "cpu")
    with torch.inference_mode():
        logits, cache = decode.prefill(model, ids, mask)
        first = logits.argmax(-1)
        step_mask, pos = batching.step_inputs(mask)
        second = decode.decode_one_token(model, first, cache, pos, step_mask).argmax(-1)
    alone = torch.cat([decode.greedy(model, torch.tensor([p]), new_tokens=2) for p in prompts])
    assert torch.equal(torch.stack([first, second], dim=1), alone)


def test_memory_bound_gain_follows_the_bytes(tiny_llama):
    from labkit.model import sizing

    model, tok = tiny_llama
    prompts = ["Hi", "Hello there, how are you today?"]
    gain = batching.memory_bound_gain(model, tok, 8, new_tokens=4, prompts=prompts)
    est = sizing.estimate(model.config, dtype="fp32", context=1)
    lengths = batching.prompt_lengths(tok, prompts)
    context = round(sum(lengths) / len(lengths)) + 2
    one = est.weight_bytes + est.kv_bytes_per_token * context
    eight = est.weight_bytes + est.kv_bytes_per_token * context * 8
    assert gain == pytest.approx(8 * one / eight) and 1 < gain < 8
    assert batching.memory_bound_gain(model, tok, 1, new_tokens=4, prompts=prompts) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="batch_size"):
        batching.memory_bound_gain(model, tok, 0, new_tokens=4)


def test_static_sweep_agreement_against_prompts_alone(tiny_llama, monkeypatch):
    model, tok = tiny_llama
    prompts = ["Tell me a story", "Hi", "What is two plus two?"]
    rows = batching.static_sweep(model, tok, batch_sizes=[1, 3], new_tokens=3, prompts=prompts, progress=False)
    assert [r["agreement"] for r in rows] == [1.0, 1.0]  # fp32 tiny model: padding changes no greedy token
    real = batching.alone_tokens
    monkeypatch.setattr(batching, "alone_tokens", lambda *a: real(*a) + 1)  # 'alone' answers all differ now
    rows = batching.static_sweep(model, tok, batch_sizes=[1, 3], new_tokens=3, prompts=prompts, progress=False)
    assert rows[0]["agreement"] == 1.0  # batch 1 is its own baseline
    assert rows[1]["agreement"] == pytest.approx(1 / 3)  # only the first prompt's baseline came from batch 1


def test_padding_experiment_scores_the_mixed_batch_against_its_buckets(tiny_llama):
    model, tok = tiny_llama
    rows = {r["case"]: r for r in batching.padding_experiment(model, tok, batch=3, new_tokens=2, long_repeat=1)}
    assert rows["mixed (padded to longest)"]["agreement"] == 1.0
    assert rows["bucketed (short batch, then long alone)"]["agreement"] == 1.0
    assert rows["short prompts only"]["agreement"] is None


def test_tgi_options_name_real_labkit_server_options():
    from dataclasses import fields

    from labkit.serve import launch, protocol

    rows = batching.tgi_batching_options()
    flags = [r["TGI launcher flag"] for r in rows]
    assert "--max-batch-size" in flags and "--waiting-served-ratio" in flags
    ours = {f.name for f in fields(protocol.ServerConfig)}
    for r in rows:
        name = r["labkit server"].split(" ")[0]
        assert name == "—" or name in ours, r
    assert "max_batch_size" not in batching.TGI_CLIENT_CALL and "waiting_served_ratio" in batching.TGI_ARTICLE_CALL
    with pytest.raises(ValueError, match="unknown server option"):
        launch.start_server("tiny-random", waiting_served_ratio=1.2)  # refused before any model loads
