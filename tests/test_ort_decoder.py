"""The ONNX export and the lab's own ONNX Runtime decoder: the graph transformers' exporter writes for a small
Llama gives PyTorch's logits (prefill from an empty cache, then decode steps), left-padded batches decode as
PyTorch's ``generate`` does, and the greedy loop keeps transformers' rules (min_new_tokens, end of sequence,
padding after it, a streamer that sees the prompt first)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from labkit.model import onnx
from labkit.model.ort_decoder import OrtCausalLM


def test_exported_names_are_the_cache_names_the_decoder_reads():
    inputs = ["input_ids", "attention_mask", "position_ids", "input.past_key_values.layers.0.keys",
              "input.past_key_values.layers.0.values", "input.past_key_values.layers.11.keys"]
    outputs = ["logits", "output.past_key_values.layers.0.keys", "output.past_key_values.layers.11.values"]
    assert onnx.exported_names(inputs, outputs) == {
        "input.past_key_values.layers.0.keys": "past_key_values.0.key",
        "input.past_key_values.layers.0.values": "past_key_values.0.value",
        "input.past_key_values.layers.11.keys": "past_key_values.11.key",
        "output.past_key_values.layers.0.keys": "present.0.key",
        "output.past_key_values.layers.11.values": "present.11.value"}


@pytest.fixture(scope="module")
def exported(tiny_llama, tmp_path_factory):
    """The tiny Llama exported once by the lab's exporter, and its session."""
    model, tok = tiny_llama
    folder = tmp_path_factory.mktemp("tiny-onnx")
    with onnx.quiet():
        onnx.write_export(model, tok, folder)
    return model, tok, OrtCausalLM.from_pretrained(folder, providers=["CPUExecutionProvider"])


def test_the_exported_graph_names_its_dimensions_for_tensorrts_profiles(exported, tmp_path):
    import onnx as onnx_proto

    from labkit.engines.onnxruntime import tensorrt_shape_profiles

    _, _, ort_lm = exported
    shapes = {i.name: i.shape for i in ort_lm.session.get_inputs()}
    assert shapes["input_ids"] == ["batch_size", "sequence_length"]
    assert shapes["attention_mask"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert shapes["past_key_values.0.key"] == ["batch_size", 2, "past_sequence_length", 16]
    outputs = {o.name: o.shape for o in ort_lm.session.get_outputs()}
    assert outputs["present.1.value"] == ["batch_size", 2, "past_sequence_length + sequence_length", 16]
    folder = ort_lm.folder
    onnx_proto.checker.check_model(str(folder / "model.onnx"))
    profiles = tensorrt_shape_profiles(folder / "model.onnx", max_batch=2, max_len=64)
    assert "past_key_values.0.key:1x2x0x16" in profiles["trt_profile_min_shapes"]
    assert "attention_mask:2x64" in profiles["trt_profile_max_shapes"]


def test_the_export_gives_pytorchs_logits_from_an_empty_cache_and_after_it(exported):
    import torch

    model, _, ort_lm = exported
    ids = torch.tensor([[5, 17, 300, 41, 9, 77]])
    with torch.no_grad():
        ref = model(ids).logits
    np.testing.assert_allclose(ort_lm(ids).logits.numpy(), ref.numpy(), atol=1e-4)
    first = ort_lm.forward(ids[:, :4], torch.ones(1, 4, dtype=torch.long))  # prefill 4, then 2 at once, then 1 more
    assert first.logits.shape == (1, 4, model.config.vocab_size)
    step = ort_lm.forward(ids[:, 4:5], torch.ones(1, 5, dtype=torch.long), past=first.past_key_values)
    np.testing.assert_allclose(step.logits[:, -1].numpy(), ref[:, 4].numpy(), atol=1e-4)
    more = ort_lm.forward(ids[:, 5:], torch.ones(1, 6, dtype=torch.long), past=step.past_key_values)
    np.testing.assert_allclose(more.logits[:, -1].numpy(), ref[:, 5].numpy(), atol=1e-4)


def test_a_left_padded_batch_decodes_as_pytorchs_generate(exported):
    import torch

    model, tok, ort_lm = exported
    ids = torch.tensor([[tok.pad_token_id, tok.pad_token_id, 11, 12], [21, 22, 23, 24]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6,
                             do_sample=False, pad_token_id=tok.pad_token_id)
    got = ort_lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6,
                          pad_token_id=tok.pad_token_id)
    assert got.tolist() == ref.tolist()


class _ScriptedSession:
    """A session whose next token is scripted per step (logits one-hot), with one cache layer."""

    def __init__(self, script: list[int], vocab: int = 8) -> None:
        self.script, self.vocab, self.calls = list(script), vocab, 0

    def get_inputs(self):
        shape = ["batch", 1, "past", 2]
        return [types.SimpleNamespace(name=n, type="tensor(float)", shape=shape)
                for n in ("input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value")]

    def get_outputs(self):
        return [types.SimpleNamespace(name=n) for n in ("logits", "present.0.key", "present.0.value")]

    def run(self, names, feed):
        batch, new = feed["input_ids"].shape
        token = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        logits = np.zeros((batch, new, self.vocab), np.float32)
        logits[:, -1, 7] = 1.0  # the runner-up, when the scripted token is refused
        logits[:, -1, token] = 10.0
        past = feed["past_key_values.0.key"]
        grown = np.zeros((batch, 1, past.shape[2] + new, 2), np.float32)
        return [logits, grown, grown]


def _scripted(script: list[int]) -> OrtCausalLM:
    import torch

    cfg = types.SimpleNamespace(num_key_value_heads=1, num_attention_heads=1, hidden_size=2)
    gen = types.SimpleNamespace(eos_token_id=2, pad_token_id=0)
    return OrtCausalLM(_ScriptedSession(script), cfg, gen, torch.device("cpu"))


class _Streamer:
    def __init__(self) -> None:
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended = True


def test_greedy_loop_stops_at_eos_but_not_before_min_new_tokens():
    import torch

    prompt = torch.tensor([[4, 5]])
    out = _scripted([3, 2, 6]).generate(prompt, max_new_tokens=5)
    assert out.tolist() == [[4, 5, 3, 2]], "stops after the end-of-sequence token"
    out = _scripted([3, 2, 6]).generate(prompt, max_new_tokens=5, min_new_tokens=3)
    assert out.tolist() == [[4, 5, 3, 7, 6, 6, 6]], "the end-of-sequence token is refused for the first 3 tokens"
    streamer = _Streamer()
    out = _scripted([3, 7]).generate(prompt, max_new_tokens=3, streamer=streamer)
    assert streamer.puts[0] == [[4, 5]] and streamer.puts[1:] == [[3], [7], [7]] and streamer.ended
    assert out.shape == (1, 5)


def test_greedy_loop_pads_a_finished_sequence_and_refuses_sampling():
    import torch

    class TwoRows(_ScriptedSession):
        def run(self, names, feed):
            logits, k, v = super().run(names, feed)
            if self.calls == 2:
                logits[0, -1, :] = 0
                logits[0, -1, 2] = 10.0  # row 0 ends at its second token
            return [logits, k, v]

    cfg = types.SimpleNamespace(num_key_value_heads=1, num_attention_heads=1, hidden_size=2)
    gen = types.SimpleNamespace(eos_token_id=2, pad_token_id=0)
    lm = OrtCausalLM(TwoRows([3]), cfg, gen, torch.device("cpu"))
    out = lm.generate(torch.tensor([[4], [5]]), max_new_tokens=4, pad_token_id=0)
    assert out.tolist() == [[4, 3, 2, 0, 0], [5, 3, 3, 3, 3]]
    with pytest.raises(ValueError, match="greedily"):
        lm.generate(torch.tensor([[4]]), do_sample=True)
    with pytest.raises(TypeError, match="num_beams"):
        lm.generate(torch.tensor([[4]]), num_beams=2)


def test_a_graph_without_a_cache_is_refused():
    import torch

    class NoCache(_ScriptedSession):
        def get_inputs(self):
            return super().get_inputs()[:2]

    with pytest.raises(ValueError, match="not a decoder with a KV cache"):
        OrtCausalLM(NoCache([1]), types.SimpleNamespace(), types.SimpleNamespace(), torch.device("cpu"))
