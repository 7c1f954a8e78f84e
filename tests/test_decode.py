"""The decode core: the same tokens as transformers' generate, batched and alone, with and without the cache."""
import pytest
import torch

from labkit.decoding import decode


def test_left_pad_and_positions():
    ids, mask = decode.left_pad([[5, 6, 7], [8]], pad_id=0, device="cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert decode.positions(mask).tolist() == [[0, 1, 2], [1, 1, 0]]
    assert decode.extend(mask).tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_matches_generate_on_a_padded_batch(tiny_llama, use_cache):
    model, tok = tiny_llama
    ids, mask = decode.left_pad([[11, 12, 13, 14, 15], [21, 22], [31, 32, 33]], tok.pad_token_id, "cpu")
    check = decode.same_as_generate(model, ids, mask, new_tokens=6, use_cache=use_cache)
    assert check["identical"], (check["ours"], check["generate"])
    assert len(check["ours"]) == 3 and all(len(row) == 6 for row in check["ours"])


def test_cache_on_and_off_agree(tiny_llama):
    model, _ = tiny_llama
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    assert torch.equal(decode.greedy(model, ids, new_tokens=5), decode.greedy(model, ids, new_tokens=5, use_cache=False))


def test_prefill_in_chunks_equals_one_prefill(tiny_llama):
    """A prompt fed in two chunks (mask covering the cached part) leaves the same logits and cache."""
    model, _ = tiny_llama
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10]])
    with torch.inference_mode():
        whole, cache_a = decode.prefill(model, ids, torch.ones_like(ids))
        _, cache_b = decode.prefill(model, ids[:, :5], torch.ones_like(ids[:, :5]))
        part, cache_b = decode.prefill(model, ids[:, 5:], torch.ones_like(ids), cache=cache_b)
    assert torch.allclose(whole, part, atol=1e-5)
    assert cache_a.get_seq_length() == cache_b.get_seq_length() == 8


def test_greedy_rejects_bad_token_counts(tiny_llama):
    model, _ = tiny_llama
    with pytest.raises(ValueError, match="positive integer"):
        decode.greedy(model, torch.tensor([[1, 2]]), new_tokens=0)


def test_show_source_renders_the_core():
    code = decode.show_source("prefill", "decode_one_token")
    assert "def prefill" in code.data and "def decode_one_token" in code.data
    with pytest.raises(ValueError, match="choose from"):
        decode.show_source("nope")


def test_only_the_core_calls_the_model_with_a_cache():
    """One decode core: no other labkit module runs its own prefill/decode step against a KV cache."""
    import pathlib
    import re

    core = pathlib.Path(decode.__file__).resolve()
    files = sorted(core.parents[1].rglob("*.py"))  # the whole labkit package
    assert len(files) > 40, "the lint must see the sources"
    offenders = []
    for path in files:
        if path == core:
            continue
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"model\((?:[^()]|\([^()]*\))*past_key_values=", text):
            offenders.append(f"{path.name}: {m.group(0)[:60]}")
        if re.search(r"^def (prefill|decode_one_token)\b", text, flags=re.M):
            offenders.append(f"{path.name}: defines its own prefill/decode_one_token")
    assert not offenders, offenders


def test_same_as_generate_compares_up_to_end_of_sequence(tiny_llama):
    """generate stops a row at end-of-sequence, the core does not: a row that ends early still matches."""
    model, _ = tiny_llama
    ids = torch.tensor([[3, 4, 5, 6]])
    first = decode.greedy(model, ids, new_tokens=6)[0].tolist()
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = first[2]  # the third greedy token now ends the sequence
    try:
        check = decode.same_as_generate(model, ids, new_tokens=6)
    finally:
        model.generation_config.eos_token_id = saved
    assert check["identical"] and check["compared_tokens"] == [first.index(first[2]) + 1]
