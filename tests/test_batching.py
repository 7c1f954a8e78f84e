"""labkit.batching (padding, Pareto front, the batched decoder, the sweep) and the batch panel's callbacks."""
from __future__ import annotations

import pytest
import torch

from labkit import batch_widget, batching


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


def test_prompts_and_cycle():
    prompts = batching.load_prompts("prompts")
    assert len(prompts) >= 4
    assert batching.cycle(["a", "b"], 5) == ["a", "b", "a", "b", "a"]
    with pytest.raises(ValueError, match="choose one of"):
        batching.load_prompts("nope")
    with pytest.raises(ValueError):
        batching.cycle([], 2)


# ---------------------------------------------------------------------------- the batched decoder


def _prompt_ids(tok, texts):
    return [[int(i) for i in tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)]
            for t in texts]


def test_decode_batch_matches_transformers_generate(tiny_llama):
    """Same greedy tokens as generate() on the same left-padded batch of mixed-length prompts."""
    import torch

    from labkit import models

    model, tok = tiny_llama
    texts = ["Hi", "Explain in two sentences why the sky is blue, please, in detail.", "What is 12 times 12?"]
    inputs = models.chat_inputs(tok, texts)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    expected = out[:, inputs["input_ids"].shape[1]:].tolist()
    seqs = [batching.Sequence(prompt_ids=p, max_new_tokens=6, ignore_eos=True) for p in _prompt_ids(tok, texts)]
    stats = batching.decode_batch(model, seqs, batching.eos_ids(model, tok), tok.pad_token_id)
    assert [s.tokens for s in seqs] == expected
    assert all(s.finish_reason == "length" for s in seqs)
    assert stats.steps == 6 and stats.output_tokens == 18 and stats.wasted_fraction == 0


def test_dropping_finished_sequences_saves_rows_and_keeps_tokens(tiny_llama):
    model, tok = tiny_llama
    prompts = _prompt_ids(tok, ["one", "two", "three"])
    limits = [2, 8, 4]
    streamed: list[list[tuple[int, str | None]]] = [[], [], []]

    def run(drop: bool):
        seqs = [batching.Sequence(prompt_ids=p, max_new_tokens=n, ignore_eos=True,
                                  on_token=lambda t, r, i=i: streamed[i].append((t, r)))
                for i, (p, n) in enumerate(zip(prompts, limits))]
        return seqs, batching.decode_batch(model, seqs, set(), tok.pad_token_id, drop_finished=drop)

    dropped, s1 = run(True)
    kept, s2 = run(False)
    assert [s.tokens for s in dropped] == [s.tokens for s in kept]
    assert [len(s.tokens) for s in dropped] == limits
    assert s1.computed_rows == sum(limits) and s1.wasted_fraction == 0  # 2 + 8 + 4 rows computed
    assert s2.computed_rows == 3 * max(limits) and s2.wasted_fraction > 0.4
    # the streamed callbacks saw every token once per run, the last one with its finish reason
    assert [r for _, r in streamed[0]] == [None, "length"] * 2


def test_cancel_and_abort_stop_sequences(tiny_llama):
    model, tok = tiny_llama
    p = _prompt_ids(tok, ["hello"])[0]
    flag = {"cancel": False}
    seqs = [batching.Sequence(prompt_ids=p, max_new_tokens=20, ignore_eos=True, cancelled=lambda: flag["cancel"],
                              on_token=lambda t, r: flag.update(cancel=True)),
            batching.Sequence(prompt_ids=p, max_new_tokens=5, ignore_eos=True)]
    batching.decode_batch(model, seqs, set(), tok.pad_token_id)
    assert seqs[0].finish_reason == "cancelled" and len(seqs[0].tokens) == 1
    assert seqs[1].finish_reason == "length" and len(seqs[1].tokens) == 5
    steps = {"n": 0}

    def abort() -> bool:
        steps["n"] += 1
        return steps["n"] >= 3

    seq = batching.Sequence(prompt_ids=p, max_new_tokens=50, ignore_eos=True)
    batching.decode_batch(model, [seq], set(), tok.pad_token_id, should_abort=abort)
    assert seq.finish_reason == "aborted" and len(seq.tokens) == 3


def test_eos_stops_a_sequence_unless_ignored(tiny_llama):
    model, tok = tiny_llama
    p = _prompt_ids(tok, ["hello"])[0]
    probe = batching.Sequence(prompt_ids=p, max_new_tokens=3, ignore_eos=True)
    batching.decode_batch(model, [probe], set(), tok.pad_token_id)
    first = probe.tokens[0]  # declare the first greedy token an end-of-sequence token
    stop = batching.Sequence(prompt_ids=p, max_new_tokens=3)
    batching.decode_batch(model, [stop], {first}, tok.pad_token_id)
    assert stop.tokens == [first] and stop.finish_reason == "stop"
    go_on = batching.Sequence(prompt_ids=p, max_new_tokens=3, ignore_eos=True)
    batching.decode_batch(model, [go_on], {first}, tok.pad_token_id)
    assert len(go_on.tokens) == 3


def test_decode_batch_rejects_bad_input(tiny_llama):
    model, tok = tiny_llama
    with pytest.raises(ValueError, match="at least one sequence"):
        batching.decode_batch(model, [], set(), 0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        batching.decode_batch(model, [batching.Sequence(prompt_ids=[1], max_new_tokens=0)], set(), 0)


# ------------------------------------------------------------------------------------------- the sweep


def test_static_sweep_rows_and_oom_row(tiny_llama, monkeypatch):
    model, tok = tiny_llama
    real = batching.generate

    def flaky(model_, tok_, prompts, **kw):
        if isinstance(prompts, list) and len(prompts) == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model_, tok_, prompts, **kw)

    monkeypatch.setattr(batching, "generate", flaky)
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
    monkeypatch.setattr(batching, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
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


# ------------------------------------------------------------------------------- the panel's callbacks


def _fake_measure(max_batch_size: int, max_wait_ms: float, clients: int) -> dict:
    return {"max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms, "clients": clients, "requests": clients,
            "failed": 0, "output_tokens_per_s": 10.0 * max_batch_size, "e2e_p50_s": 1.0 + max_batch_size / 10,
            "ttft_p50_s": 0.1, "duration_s": 1.0, "tokens_per_s_per_user": 5.0}


def test_panel_callback_updates_figure_in_place():
    fig = batch_widget.make_figure(widget=True)
    state = batch_widget.PanelState()
    batch_widget.on_change(state, fig, {"max_batch_size": 4, "max_wait_ms": 20, "clients": 8}, _fake_measure)
    batch_widget.on_change(state, fig, {"max_batch_size": 1, "max_wait_ms": 20, "clients": 8}, _fake_measure)
    assert list(fig.data[0].x) == [1, 4] and list(fig.data[0].y) == [10.0, 40.0]
    assert list(fig.data[1].y) == [1.1, 1.4]
    assert list(fig.data[2].x) == [1]  # the latest point is circled
    # another client count starts its own curve; re-measuring a setting replaces its point
    batch_widget.on_change(state, fig, {"max_batch_size": 2, "max_wait_ms": 20, "clients": 4}, _fake_measure)
    assert list(fig.data[0].x) == [2]
    batch_widget.on_change(state, fig, {"max_batch_size": 2, "max_wait_ms": 20, "clients": 4}, _fake_measure)
    assert len(state.points) == 3
    assert "4 clients" in fig.layout.title.text


def test_panel_widgets_follow_the_slider(monkeypatch):
    calls = []

    def fake(server, max_tokens, progress=None, superseded=None, rounds=1, max_rounds=None, **values):
        calls.append(values)
        if progress:
            progress(1, 1)
        return _fake_measure(**values)

    monkeypatch.setattr(batch_widget, "measure_point", fake)
    box = batch_widget.panel(server=object(), batch_size=8, clients=8)
    assert box.measurer.wait(30)  # measuring runs in the background: the cell returned at once
    assert [c["max_batch_size"] for c in calls] == [8, 8]  # an untimed warm-up burst, then the first point
    assert len(box.state.points) == 1 and list(box.figure.data[0].x) == [8]
    slider = box.controls["batch"]
    assert slider.description == "batch size"
    slider.value = 2
    assert box.measurer.wait(30)
    box.measurer.close(30)
    assert calls[-1]["max_batch_size"] == 2 and list(box.figure.data[0].x) == [2, 8]


def test_measure_point_refuses_a_stopped_server():
    class Stopped:
        running = False

    with pytest.raises(RuntimeError, match="stopped"):
        batch_widget.measure_point(Stopped(), 4, 20, 2)
    with pytest.raises(ValueError, match="clients"):
        batch_widget.measure_point(Stopped(), 4, 20, 0)


# ------------------------------------------------------------- the batched step, quality, claims, takeaways


def test_step_inputs_grow_the_mask_and_count_real_tokens():
    mask = torch.tensor([[1, 1, 1], [0, 0, 1], [0, 1, 1]])
    grown, pos = batching.step_inputs(mask)
    assert grown.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]]
    assert pos.tolist() == [3, 1, 2]  # a row with n real tokens puts the new one at position n


def test_step_inputs_drive_a_batched_step_like_each_prompt_alone(tiny_llama):
    """One prefill and one step on a left-padded batch give each prompt the tokens it gets alone."""
    from labkit import decode

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
    from labkit import sizing

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

    from labkit import serving

    rows = batching.tgi_batching_options()
    flags = [r["TGI launcher flag"] for r in rows]
    assert "--max-batch-size" in flags and "--waiting-served-ratio" in flags
    ours = {f.name for f in fields(serving.ServerConfig)}
    for r in rows:
        name = r["labkit server"].split(" ")[0]
        assert name == "—" or name in ours, r
    assert "max_batch_size" not in batching.TGI_CLIENT_CALL and "waiting_served_ratio" in batching.TGI_ARTICLE_CALL
    with pytest.raises(ValueError, match="unknown server option"):
        serving.start_server("tiny-random", waiting_served_ratio=1.2)  # refused before any model loads


def _batching_findings(**over):
    sweep = [{"batch_size": 1, "status": "ok", "total_tokens_per_s": 10.0, "tokens_per_s_per_user": 10.0,
              "ttft_s": 0.1, "agreement": 1.0},
             {"batch_size": 8, "status": "ok", "total_tokens_per_s": 50.0, "tokens_per_s_per_user": 6.25,
              "ttft_s": 0.4, "agreement": 1.0}]
    padding = [{"case": "mixed", "wasted_fraction": 0.6, "ttft_s": 2.0, "agreement": 1.0},
               {"case": "bucketed", "wasted_fraction": 0.1, "ttft_s": 1.0, "agreement": 1.0}]
    serving_rows = [{"max_batch_size": 1, "mean_batch_size": 1.0, "output_tokens_per_s": 10.0, "tpot_p50_s": 0.05,
                     "failed": 0},
                    {"max_batch_size": 8, "mean_batch_size": 6.5, "output_tokens_per_s": 40.0, "tpot_p50_s": 0.08,
                     "failed": 0}]
    open_loop = [{"arrivals": "Poisson", "ttft_p90_s": 0.5, "goodput": 1.9},
                 {"arrivals": "bursty", "ttft_p90_s": 1.5, "goodput": 1.2}]
    args = dict(sweep=sweep, memory_bound_gain=7.5, padding=padding, serving=serving_rows, open_loop=open_loop,
                clients=8, request_rate=2.0)
    args.update(over)
    return batching.findings(**args)


def test_batching_findings_choose_their_words_by_the_numbers():
    text = " ".join(_batching_findings().sentences)
    assert "5.0× the total tokens/s" in text and "less than the memory-bound model's 7.5×" in text
    assert "Batching changed no answer" in text and "prefilled 2.0× faster" in text
    assert "4.0× the tokens/s" in text and "1.6× slower" in text and "3.0× Poisson's (worse)" in text
    sweep = [{"batch_size": 1, "status": "ok", "total_tokens_per_s": 10.0, "tokens_per_s_per_user": 10.0,
              "ttft_s": 0.1, "agreement": 1.0},
             {"batch_size": 4, "status": "ok", "total_tokens_per_s": 90.0, "tokens_per_s_per_user": 22.5,
              "ttft_s": 0.1, "agreement": 0.75}]
    text = " ".join(_batching_findings(sweep=sweep, memory_bound_gain=3.9).sentences)
    assert "more than the memory-bound model's 3.9×" in text and "at batch 4 only 75% of the tokens" in text
    with pytest.raises(ValueError, match="two server rows"):
        _batching_findings(serving=[])
