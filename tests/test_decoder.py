"""labkit.serve.decoder: the batched decoder gives generate()'s greedy tokens, drops finished sequences, stops
on cancel, abort and end-of-sequence, and refuses bad input."""
from __future__ import annotations

import pytest

from labkit.serve import decoder


def _prompt_ids(tok, texts):
    return [[int(i) for i in tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                         return_dict=False)]
            for t in texts]


def test_decode_batch_matches_transformers_generate(tiny_llama):
    """Same greedy tokens as generate() on the same left-padded batch of mixed-length prompts."""
    import torch

    from labkit.model import models

    model, tok = tiny_llama
    texts = ["Hi", "Explain in two sentences why the sky is blue, please, in detail.", "What is 12 times 12?"]
    inputs = models.chat_inputs(tok, texts)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    expected = out[:, inputs["input_ids"].shape[1]:].tolist()
    seqs = [decoder.Sequence(prompt_ids=p, max_new_tokens=6, ignore_eos=True) for p in _prompt_ids(tok, texts)]
    stats = decoder.decode_batch(model, seqs, decoder.eos_ids(model, tok), tok.pad_token_id)
    assert [s.tokens for s in seqs] == expected
    assert all(s.finish_reason == "length" for s in seqs)
    assert stats.steps == 6 and stats.output_tokens == 18 and stats.wasted_fraction == 0


def test_dropping_finished_sequences_saves_rows_and_keeps_tokens(tiny_llama):
    model, tok = tiny_llama
    prompts = _prompt_ids(tok, ["one", "two", "three"])
    limits = [2, 8, 4]
    streamed: list[list[tuple[int, str | None]]] = [[], [], []]

    def run(drop: bool):
        seqs = [decoder.Sequence(prompt_ids=p, max_new_tokens=n, ignore_eos=True,
                                  on_token=lambda t, r, i=i: streamed[i].append((t, r)))
                for i, (p, n) in enumerate(zip(prompts, limits))]
        return seqs, decoder.decode_batch(model, seqs, set(), tok.pad_token_id, drop_finished=drop)

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
    seqs = [decoder.Sequence(prompt_ids=p, max_new_tokens=20, ignore_eos=True, cancelled=lambda: flag["cancel"],
                              on_token=lambda t, r: flag.update(cancel=True)),
            decoder.Sequence(prompt_ids=p, max_new_tokens=5, ignore_eos=True)]
    decoder.decode_batch(model, seqs, set(), tok.pad_token_id)
    assert seqs[0].finish_reason == "cancelled" and len(seqs[0].tokens) == 1
    assert seqs[1].finish_reason == "length" and len(seqs[1].tokens) == 5
    steps = {"n": 0}

    def abort() -> bool:
        steps["n"] += 1
        return steps["n"] >= 3

    seq = decoder.Sequence(prompt_ids=p, max_new_tokens=50, ignore_eos=True)
    decoder.decode_batch(model, [seq], set(), tok.pad_token_id, should_abort=abort)
    assert seq.finish_reason == "aborted" and len(seq.tokens) == 3


def test_eos_stops_a_sequence_unless_ignored(tiny_llama):
    model, tok = tiny_llama
    p = _prompt_ids(tok, ["hello"])[0]
    probe = decoder.Sequence(prompt_ids=p, max_new_tokens=3, ignore_eos=True)
    decoder.decode_batch(model, [probe], set(), tok.pad_token_id)
    first = probe.tokens[0]  # declare the first greedy token an end-of-sequence token
    stop = decoder.Sequence(prompt_ids=p, max_new_tokens=3)
    decoder.decode_batch(model, [stop], {first}, tok.pad_token_id)
    assert stop.tokens == [first] and stop.finish_reason == "stop"
    go_on = decoder.Sequence(prompt_ids=p, max_new_tokens=3, ignore_eos=True)
    decoder.decode_batch(model, [go_on], {first}, tok.pad_token_id)
    assert len(go_on.tokens) == 3


def test_decode_batch_rejects_bad_input(tiny_llama):
    model, tok = tiny_llama
    with pytest.raises(ValueError, match="at least one sequence"):
        decoder.decode_batch(model, [], set(), 0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.decode_batch(model, [decoder.Sequence(prompt_ids=[1], max_new_tokens=0)], set(), 0)
