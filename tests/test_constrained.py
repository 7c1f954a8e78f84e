"""The token mask of structured outputs: a choice and a pattern, applied in the decode core's greedy loop."""
from __future__ import annotations

import json

from labkit.decoding import constrained
from labkit.lessons import exercises

VOCAB = ["<eos>", "y", "e", "s", "n", "o", "ye", "yes", "no", "{", "}", "\"", "a", ":", " ", "1", "2", "", "x"] + \
        [f"t{i}" for i in range(96 - 19)]


def test_choice_mask_follows_the_text_so_far():
    allowed = constrained.choice_mask("y", ["yes", "no"], VOCAB, 0)
    names = {VOCAB[i] for i, a in enumerate(allowed) if a}
    assert names == {"e"}, names
    assert constrained.choice_mask("yes", ["yes", "no"], VOCAB, 0)[0] is True
    assert not constrained.choice_mask("ye", ["yes", "no"], VOCAB, 0)[0]
    assert not constrained.choice_mask("", ["yes"], VOCAB, 0)[VOCAB.index("")], "the empty token never comes next"


def test_regex_mask_allows_only_what_can_still_match():
    allowed = constrained.regex_mask("{\"a\":", r'\{"a": [0-9]+\}', VOCAB, 0)
    assert {VOCAB[i] for i, a in enumerate(allowed) if a} == {" "}
    assert constrained.regex_mask("{\"a\": 12}", r'\{"a": [0-9]+\}', VOCAB, 0)[0]


def test_constrained_greedy_always_ends_in_a_choice():
    model = exercises.tiny_llama(vocab_size=len(VOCAB))
    for seed_prompt in ([5, 6, 7], [9, 10], [2]):
        free = constrained.constrained_greedy(model, None, seed_prompt, None, 6, VOCAB, eos_id=0)
        out = constrained.constrained_greedy(model, None, seed_prompt,
                                             lambda t, v, e: constrained.choice_mask(t, ["yes", "no"], v, e), 6,
                                             VOCAB, eos_id=0)
        assert out.finished and out.text in ("yes", "no"), (out.text, free.text)
        assert len(out.mask_s) == len(out.tokens) + 1  # one mask per step, the end-of-sequence step included


def test_a_pattern_constrained_answer_parses():
    model = exercises.tiny_llama(vocab_size=len(VOCAB))
    out = constrained.constrained_greedy(model, None, [3, 4], lambda t, v, e: constrained.regex_mask(
        t, r'\{"a": [12]{1,3}\}', v, e), 16, VOCAB, eos_id=0)
    assert out.finished and json.loads(out.text)["a"] in range(1, 223) and constrained.parses(out.text)
    assert not constrained.parses('{"a": ')
