"""Sampling and stop strings, in labkit.decoding.sampling and through the server's OpenAI API (official client too)."""
from __future__ import annotations

import json

import pytest
import torch

from labkit.decoding import sampling
from labkit.serve import launch, protocol
from test_server import request, sse_events


def test_greedy_rows_and_sampled_rows():
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0]])
    tokens = sampling.choose(logits, [None, sampling.Sampling(temperature=0)])
    assert tokens.tolist() == [1, 1]


def test_sampling_follows_the_distribution_and_the_seed():
    logits = torch.log(torch.tensor([0.25, 0.75]))
    s = sampling.Sampling(temperature=1.0, seed=3)
    draws = [int(sampling.sample(logits, s)) for _ in range(4000)]
    assert abs(sum(draws) / len(draws) - 0.75) < 0.03
    again = sampling.Sampling(temperature=1.0, seed=3)
    assert [int(sampling.sample(logits, again)) for _ in range(50)] == draws[:50]


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    s = sampling.Sampling(temperature=1.0, top_p=0.7, seed=0)  # nucleus: tokens 0 and 1 (0.5 + 0.3 ≥ 0.7)
    assert {int(sampling.sample(logits, s)) for _ in range(500)} == {0, 1}
    tight = sampling.Sampling(temperature=1.0, top_p=0.01, seed=0)
    assert {int(sampling.sample(logits, tight)) for _ in range(50)} == {0}


def test_bad_sampling_settings_name_the_fix():
    for kwargs, word in (({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"seed": 1.5}, "seed")):
        with pytest.raises(ValueError, match=word):
            sampling.Sampling(**kwargs)


def test_stop_text_holds_back_a_possible_stop_and_cuts_before_it(tiny_llama):
    _, tok = tiny_llama
    ids = tok("The cat sat on the mat. Then it slept.", add_special_tokens=False)["input_ids"]
    text = tok.decode(ids, skip_special_tokens=True)
    st = protocol.StopText(tok, ["mat.", "zzz"])
    out = "".join(st.add(i) for i in ids)
    assert st.stopped and out == text[:text.index("mat.")]
    st = protocol.StopText(tok, ["zzz"])
    assert "".join(st.add(i) for i in ids) + st.finish() == text and not st.stopped


@pytest.fixture(scope="module")
def server():
    with launch.run_server(protocol.TINY_RANDOM, port=0, max_batch_size=8) as srv:
        yield srv


def complete(url: str, **body) -> dict:
    status, _, text = request(url + "/v1/completions", {"prompt": "Tell me a story", **body})
    assert status == 200, text
    return json.loads(text)


def test_seeded_sampling_is_reproducible_and_differs_from_greedy(server):
    greedy = complete(server.url, max_tokens=12, ignore_eos=True)["choices"][0]["text"]
    assert complete(server.url, max_tokens=12, ignore_eos=True, temperature=0)["choices"][0]["text"] == greedy
    a = complete(server.url, max_tokens=12, ignore_eos=True, temperature=0.9, seed=7)["choices"][0]["text"]
    b = complete(server.url, max_tokens=12, ignore_eos=True, temperature=0.9, seed=7)["choices"][0]["text"]
    assert a == b
    others = {complete(server.url, max_tokens=12, ignore_eos=True, temperature=0.9, seed=s)["choices"][0]["text"]
              for s in range(1, 5)}
    assert others - {greedy}, "sampling at temperature 0.9 gave the greedy answer every time"


def test_stop_string_ends_the_answer_streaming_and_not(server):
    full = complete(server.url, max_tokens=16, ignore_eos=True)["choices"][0]["text"]
    stop = full[6:9]
    assert stop.strip(), full
    cut = full[:full.index(stop)]
    data = complete(server.url, max_tokens=16, ignore_eos=True, stop=[stop])
    assert data["choices"][0]["text"] == cut and data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens"] < 16
    _, _, text = request(server.url + "/v1/completions",
                         {"prompt": "Tell me a story", "max_tokens": 16, "ignore_eos": True, "stop": stop, "stream": True})
    chunks = sse_events(text)
    assert "".join(c["choices"][0]["text"] for c in chunks) == cut
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("body,param", [
    ({"presence_penalty": 0.5}, "presence_penalty"), ({"logprobs": 2}, "logprobs"), ({"best_of": 3}, "best_of"),
    ({"logit_bias": {"5": 10}}, "logit_bias"), ({"frobnicate": True}, "frobnicate"), ({"top_p": 0}, "top_p"),
    ({"seed": "x"}, "seed"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": [""]}, "stop"),
])
def test_unsupported_or_bad_parameters_get_400_naming_them(server, body, param):
    status, _, text = request(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2, **body})
    err = json.loads(text)["error"]
    assert status == 400 and err["param"] == param and param in err["message"], err


def test_parameters_at_their_defaults_are_fine(server):
    complete(server.url, max_tokens=2, presence_penalty=0, frequency_penalty=0, n=1, user="someone", logprobs=None)


def test_official_openai_client(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    chat = client.chat.completions.create(model=protocol.TINY_RANDOM, max_tokens=5,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 5
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=protocol.TINY_RANDOM, max_tokens=5, stream=True, messages=[{"role": "user", "content": "Hi"}]) if c.choices]
    assert "".join(pieces) == chat.choices[0].message.content
    comp = client.completions.create(model=protocol.TINY_RANDOM, prompt="Hello", max_tokens=4, temperature=0.8, seed=1)
    again = client.completions.create(model=protocol.TINY_RANDOM, prompt="Hello", max_tokens=4, temperature=0.8, seed=1)
    assert comp.choices[0].text == again.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=protocol.TINY_RANDOM, prompt="Hello", max_tokens=4, presence_penalty=1.0)
