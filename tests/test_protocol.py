"""labkit.serve.protocol: the detokenizer never splits a character."""
from __future__ import annotations

from labkit.serve import protocol


def test_detokenizer_never_splits_a_character(server):
    tok = server.server.lm.tokenizer
    ids = tok("naïve café — 日本語 ✓")["input_ids"]
    detok = protocol.Detokenizer(tok)
    pieces = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in pieces)
