"""Structured outputs on the lab's server (labkit.decoding.grammar): response_format json_schema/json_object answers
that parse and follow their schema, 400s that name the field at fault, a grammar that leaves the other sequences of
its batch alone, and a compile cache that compiles each schema once."""
from __future__ import annotations

import json
import sys

import jsonschema
import pytest

from labkit.decoding import grammar as structured
from labkit.serve import continuous, decoder, launch, protocol
from test_server import request, sse_events

# a finite language: even a random model, held to it, must close the object within a few dozen tokens
SMALL = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "ok": {"type": "boolean"}},
         "required": ["answer", "ok"], "additionalProperties": False}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


def fmt(schema, name: str = "answer", **extra) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, **extra}}


def answer(body: str, chat: bool) -> tuple[str, str]:
    choice = json.loads(body)["choices"][0]
    return (choice["message"]["content"] if chat else choice["text"]), choice["finish_reason"]


# ------------------------------------------------------------------------------------------- over HTTP


@pytest.mark.parametrize("chat", [False, True])
def test_json_schema_answer_parses_and_follows_the_schema(server, chat):
    path, prompt = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Is it?"}]}) if chat \
        else ("/v1/completions", {"prompt": "Is it?"})
    body = {**prompt, "max_tokens": 64, "response_format": fmt(SMALL, strict=True)}
    status, _, plain = request(server.url + path, body)
    assert status == 200, plain
    text, reason = answer(plain, chat)
    assert reason == "stop", (reason, text)  # the grammar is finite: EOS is forced once the object closes
    jsonschema.validate(json.loads(text), SMALL)
    _, _, streamed = request(server.url + path, {**body, "stream": True})
    chunks = sse_events(streamed)
    key = "delta" if chat else None
    assert "".join(c["choices"][0][key].get("content", "") if key else c["choices"][0]["text"] for c in chunks) == text


def test_unconstrained_random_model_does_not_write_json(server):
    """The test above can fail: the same prompt without response_format is not the schema's JSON."""
    status, _, plain = request(server.url + "/v1/completions", {"prompt": "Is it?", "max_tokens": 24})
    text, _ = answer(plain, chat=False)
    with pytest.raises((json.JSONDecodeError, jsonschema.ValidationError)):
        jsonschema.validate(json.loads(text), SMALL)


def test_sampled_answer_follows_the_schema_too(server):
    body = {"prompt": "Is it?", "max_tokens": 64, "temperature": 1.0, "seed": 7, "response_format": fmt(SMALL)}
    status, _, plain = request(server.url + "/v1/completions", body)
    text, reason = answer(plain, chat=False)
    assert status == 200 and reason == "stop", plain
    jsonschema.validate(json.loads(text), SMALL)


def test_text_type_is_unconstrained_and_json_object_starts_an_object(server):
    plain_body = {"prompt": "Is it?", "max_tokens": 8}
    _, _, free = request(server.url + "/v1/completions", plain_body)
    _, _, text = request(server.url + "/v1/completions", {**plain_body, "response_format": {"type": "text"}})
    assert answer(text, False) == answer(free, False)
    _, _, obj = request(server.url + "/v1/completions", {**plain_body, "max_tokens": 40,
                                                         "response_format": {"type": "json_object"}})
    out, reason = answer(obj, False)
    assert out.startswith("{") and out != answer(free, False)[0]
    if reason == "stop":
        assert isinstance(json.loads(out), dict)
    else:
        assert reason == "length"  # any object: a random model may still be inside a string at the limit


BAD_FORMATS = {
    "schema not an object": (fmt([1, 2]), "response_format.json_schema.schema"),
    "schema a string": (fmt('{"type": "object"}'), "response_format.json_schema.schema"),
    "unknown type": ({"type": "xml"}, "response_format.type"),
    "no type": ({"json_schema": {"name": "a", "schema": SMALL}}, "response_format.type"),
    "xgrammar refuses the schema": (fmt({"type": "integer", "minimum": 5, "maximum": 2}),
                                    "response_format.json_schema.schema"),
    "unknown schema type": (fmt({"type": "colour"}), "response_format.json_schema.schema"),
    "missing json_schema": ({"type": "json_schema"}, "response_format.json_schema"),
    "json_schema not an object": ({"type": "json_schema", "json_schema": "x"}, "response_format.json_schema"),
    "missing name": ({"type": "json_schema", "json_schema": {"schema": SMALL}}, "response_format.json_schema.name"),
    "strict not a bool": (fmt(SMALL, strict="yes"), "response_format.json_schema.strict"),
    "unknown field": (fmt(SMALL, colour="red"), "response_format.json_schema.colour"),
    "not an object": ("json", "response_format"),
}


@pytest.mark.parametrize("case", sorted(BAD_FORMATS))
def test_bad_response_format_gets_400_naming_the_field(server, case):
    rf, param = BAD_FORMATS[case]
    status, _, body = request(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 4, "response_format": rf})
    err = json.loads(body)["error"]
    assert status == 400 and err["param"] == param, (case, status, err)
    assert param in err["message"] or param == "response_format", err["message"]


def test_refused_schema_message_carries_xgrammar_reason(server):
    _, _, body = request(server.url + "/v1/completions", {"prompt": "hi", "response_format": fmt({"type": "colour"})})
    message = json.loads(body)["error"]["message"]
    assert 'Unsupported type "colour"' in message and ".cc:" not in message, message


def test_ignore_eos_with_a_response_format_is_refused(server):
    status, _, body = request(server.url + "/v1/completions", {"prompt": "hi", "ignore_eos": True,
                                                               "response_format": fmt(SMALL)})
    assert status == 400 and json.loads(body)["error"]["param"] == "ignore_eos"


def test_metrics_count_grammar_compiles_and_hits(server):
    body = {"prompt": "hi", "max_tokens": 64, "response_format": fmt({**SMALL, "title": "metrics-only"})}
    for _ in range(2):
        assert request(server.url + "/v1/completions", body)[0] == 200

    def value(text: str, name: str) -> float:
        return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))
    text = request(server.url + "/metrics", method="GET")[2]
    grammars = server.server.grammars
    assert value(text, "labkit_grammar_compiles_total") == grammars.misses >= 1
    assert value(text, "labkit_grammar_cache_hits_total") == grammars.hits >= 1


def test_default_model_fills_a_schema_over_http(default_lm):
    with launch.run_server(default_lm, port=0, max_batch_size=4, batching="continuous") as srv:
        body = {"messages": [{"role": "user", "content": "Invent a person: give a name and an age."}],
                "max_tokens": 48, "response_format": fmt(PERSON, name="person", strict=True)}
        status, _, plain = request(srv.url + "/v1/chat/completions", body)
        text, reason = answer(plain, chat=True)
        assert status == 200 and reason == "stop", plain
        jsonschema.validate(json.loads(text), PERSON)


# --------------------------------------------------------------------------------------- decode, no HTTP


@pytest.fixture(scope="module")
def grammar_cache(tiny_llama):
    model, tok = tiny_llama
    return structured.grammars(tok, model.config.vocab_size)


def _seqs(tok, grammar, eos):
    free = decoder.Sequence(prompt_ids=tok("The weather today")["input_ids"], max_new_tokens=30, ignore_eos=True)
    held = decoder.Sequence(prompt_ids=tok("Is it?")["input_ids"], max_new_tokens=40,
                            constraint=structured.Constraint(grammar, eos) if grammar is not None else None)
    return free, held


@pytest.mark.parametrize("engine", ["decode_batch", "continuous"])
def test_constrained_sequence_leaves_its_batch_mates_untouched(tiny_llama, grammar_cache, engine):
    model, tok = tiny_llama
    eos = decoder.eos_ids(model, tok)
    grammar = grammar_cache.compile(structured.ResponseFormat.json_schema(SMALL))

    def run(seqs):
        if engine == "decode_batch":
            decoder.decode_batch(model, seqs, eos, tok.pad_token_id)
        else:
            core = continuous.ContinuousEngine(model, eos, tok.pad_token_id)
            for s in seqs:
                core.admit(s)
            while core.busy:
                core.step()
    alone, free_held = _seqs(tok, None, eos)
    run([alone])
    free, held = _seqs(tok, grammar, eos)
    run([free, held])
    assert free.tokens == alone.tokens and len(free.tokens) == 30  # greedy, untouched by the masked row beside it
    assert held.finish_reason == "stop" and len(held.tokens) < 30  # it left the batch early; free went on alone
    jsonschema.validate(json.loads(tok.decode(held.tokens, skip_special_tokens=True)), SMALL)
    run([free_held])
    assert free_held.tokens != held.tokens  # without its constraint the same prompt writes something else


def test_pick_masks_only_constrained_rows(tiny_llama, grammar_cache):
    import torch

    model, tok = tiny_llama
    eos = decoder.eos_ids(model, tok)
    grammar = grammar_cache.compile(structured.ResponseFormat.json_schema(SMALL))
    logits = torch.randn(3, model.config.vocab_size, generator=torch.Generator(device="cpu").manual_seed(0),
                         device="cpu")
    before = logits.clone()
    seqs = [decoder.Sequence([1], 4), decoder.Sequence([1], 4, constraint=structured.Constraint(grammar, eos)),
            decoder.Sequence([1], 4)]
    tokens = decoder.pick(logits, seqs).tolist()
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert 0 < len(allowed) < 10 and tokens[1] in allowed and all(tok.decode([t]).startswith("{") for t in allowed)


def test_end_of_sequence_only_once_the_json_is_complete(tiny_llama, grammar_cache):
    import torch

    model, tok = tiny_llama
    eos = decoder.eos_ids(model, tok)
    constraint = structured.Constraint(grammar_cache.compile(structured.ResponseFormat.json_schema(SMALL)), eos)
    ids = tok(json.dumps({"answer": "yes", "ok": False}))["input_ids"]
    for token in ids:
        row = torch.zeros(model.config.vocab_size, device="cpu")
        constraint.mask(row)
        assert torch.isfinite(row[token]) and all(row[e] == float("-inf") for e in eos) and not constraint.completed
        constraint.accept(token)
    row = torch.zeros(model.config.vocab_size, device="cpu")
    constraint.mask(row)
    assert constraint.completed and set(torch.isfinite(row).nonzero().flatten().tolist()) == eos
    with pytest.raises(RuntimeError, match="breaks the response_format grammar"):
        constraint.accept(ids[0])
    constraint.accept(min(eos))
    assert constraint.terminated


def test_compile_cache_compiles_each_schema_once(tiny_llama):
    model, tok = tiny_llama
    cache = structured.grammars(tok, model.config.vocab_size)
    assert structured.grammars(tok, model.config.vocab_size) is cache  # one cache per (tokenizer, vocabulary)
    fmt_ = structured.ResponseFormat.json_schema({**PERSON, "title": "cache-test"}, name="p")
    hits, misses = cache.hits, cache.misses
    first = cache.compile(fmt_)
    first_call_s = cache.last_s
    assert (cache.hits, cache.misses) == (hits, misses + 1) and first.compile_s > 0
    again = cache.compile(structured.ResponseFormat.json_schema({**PERSON, "title": "cache-test"}, name="other"))
    assert again is first and (cache.hits, cache.misses) == (hits + 1, misses + 1)
    assert cache.last_s < first_call_s and again.compile_s == first.compile_s
    other = cache.compile(structured.ResponseFormat.json_schema({**PERSON, "title": "cache-test-2"}))
    assert other is not first and cache.misses == misses + 2


def test_compile_refusal_is_a_value_error_with_the_reason(grammar_cache):
    bad = structured.ResponseFormat.json_schema({"type": "integer", "minimum": 5, "maximum": 2})
    with pytest.raises(ValueError, match="minimum greater than maximum"):
        grammar_cache.compile(bad)
    with pytest.raises(ValueError, match="ResponseFormat.json_schema"):
        grammar_cache.compile({"type": "object"})


def test_masking_needs_no_triton():
    assert "triton" not in sys.modules  # the CPU kernel and the plain-torch one are all the server uses


def test_parse_body_keeps_the_format_on_params():
    cfg = protocol.ServerConfig()
    p = protocol.parse_body(json.dumps({"prompt": "x", "response_format": fmt(SMALL, strict=True)}).encode(),
                            False, cfg)
    assert p.response_format.kind == "json_schema" and json.loads(p.response_format.schema) == SMALL
    assert p.response_format.name == "answer" and p.response_format.strict is True
    assert list(json.loads(p.response_format.schema)["properties"]) == ["answer", "ok"]  # order kept
    obj = protocol.parse_body(b'{"prompt": "x", "response_format": {"type": "json_object"}}', False, cfg)
    assert obj.response_format == structured.ResponseFormat.json_object()
    assert protocol.parse_body(b'{"prompt": "x", "response_format": {"type": "text"}}', False, cfg).response_format \
        is None
