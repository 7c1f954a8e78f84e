"""labkit.model.models: resolving a model names the fix, chat inputs are left-padded, and the converted default
model is the real chat model."""
from __future__ import annotations

import pytest

from labkit import __main__ as cli
from labkit.core import env
from labkit.decoding import generation
from labkit.model import dtypes, models


def test_resolve_errors(tmp_path, monkeypatch):
    with pytest.raises(models.ModelNotFound, match="config.json"):
        models.resolve(str(tmp_path))
    with pytest.raises(models.ModelNotFound, match="LABKIT_MODEL"):
        models.resolve("not-a-hub-id")
    monkeypatch.setenv("LABKIT_MODEL", "./nope/missing")
    with pytest.raises(models.ModelNotFound):
        models.resolve()
    with pytest.raises(ValueError, match="quantised"):
        dtypes.torch_dtype("int8")
    with pytest.raises(ValueError, match="unknown dtype"):
        dtypes.torch_dtype("fp64")


def test_chat_inputs_left_pads():
    tok = models.load_tokenizer()
    enc = models.chat_inputs(tok, ["hi", "a considerably longer question about many things"])
    mask = enc["attention_mask"]
    assert mask.shape[0] == 2 and mask[0, 0] == 0 and mask[0, -1] == 1  # padding on the left
    with pytest.raises(ValueError, match="no prompts"):
        models.chat_inputs(tok, [])


def test_default_model_answers_correctly(default_lm):
    """The converted default model is the real chat model: greedy answer names Paris."""
    assert default_lm.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert sum(p.numel() for p in default_lm.model.parameters()) == 134_515_008
    r = generation.generate(default_lm.model, default_lm.tokenizer, "What is the capital of France?", max_new_tokens=12)
    assert "Paris" in r.text


# ------------------------------------------------------------------------------ the prepared tokenizer

# run in both environments (the lab's, and vLLM's through its python): prints the ids as JSON
TOKENISE = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
chat = "What is the capital of France? Answer in 12 words: 1234567 -> 3.14!  \u00c7a va?\\n\\tdone"
text = tok.apply_chat_template([{"role": "user", "content": chat}], add_generation_prompt=True, tokenize=False)
print(json.dumps({"chat": tok(text, add_special_tokens=False)["input_ids"], "plain": tok("Hello world 2024")["input_ids"],
                  "eos": tok.eos_token_id, "pad": tok.pad_token_id, "bos": tok.bos_token_id}))
"""


def _ids(python: str, path: str) -> dict:
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # each environment its own transformers
    out = subprocess.run([python, "-c", TOKENISE, path], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_prepared_tokenizer_is_the_ggufs():
    """EOS and padding are <|im_end|> (id 2), no BOS is added, each digit is its own piece (the GGUF's `smollm`
    pre-tokenizer), and spaces survive: what the GGUF says, not what transformers 4.x's GGUF reader wrote."""
    path = models.prepare_default()
    assert models.prepared_format(path) == models.PREPARED_FORMAT
    tok = models.load_tokenizer()
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == ("<|im_end|>", 2, 2, 1)
    ids = tok("Hello world 2024")["input_ids"]
    assert ids[0] != tok.bos_token_id, "no BOS added"
    assert tok.convert_ids_to_tokens(ids[-4:]) == ["2", "0", "2", "4"]
    assert tok.decode(tok("Hello  world, it's 2024 .")["input_ids"]) == "Hello  world, it's 2024 ."


def test_an_older_prepared_cache_is_prepared_again(tmp_path):
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    assert not models._complete(tmp_path), "no marker: written by an older labkit"
    (tmp_path / models.MARKER).write_text('{"format": %d}' % (models.PREPARED_FORMAT - 1))
    assert not models._complete(tmp_path)
    (tmp_path / models.MARKER).write_text('{"format": %d}' % models.PREPARED_FORMAT)
    assert models._complete(tmp_path)


def test_vllm_reads_the_prepared_tokenizer_as_the_lab_does():
    """The same chat, tokenised by the lab's transformers (4.x) and by vLLM's (5.x): the same ids."""
    import sys

    from labkit.serve.vllm import server as vllm_server

    py = vllm_server.vllm_python()
    if not py.exists():
        pytest.skip(vllm_server.MISSING)
    path = str(models.prepare_default())
    lab, theirs = _ids(sys.executable, path), _ids(str(py), path)
    assert lab["eos"] == 2 and lab["chat"][0] == 1, lab  # the chat template opens with <|im_start|>
    assert theirs == lab


def test_the_default_models_fp32_is_said_to_be_its_gguf_dequantised(monkeypatch):
    """Its "fp32" weights are the Q4_1 GGUF dequantised: the note reads the storage types from the GGUF itself and
    names the hub id of the original weights; for any other model there is nothing to say."""
    monkeypatch.delenv("LABKIT_MODEL", raising=False)
    types = models.gguf_tensor_types(models.default_gguf())
    assert next(iter(types)) == "Q4_1" and sum(types.values()) == 272, types
    note = models.reference_note()
    assert "stored as Q4_1" in note and "LABKIT_MODEL=HuggingFaceTB/SmolLM2-135M-Instruct" in note
    monkeypatch.setenv("LABKIT_MODEL", "Qwen/Qwen2.5-1.5B-Instruct")
    assert models.reference_note() == ""


def test_prepare_exports_the_onnx_graph_unless_told_not(monkeypatch, tmp_path, capsys):
    """make setup's `labkit prepare` also exports the graph notebooks 03, 08 and 10 read (minutes, once, at set-up);
    `--no-onnx` skips it, and an environment without the exporter says why instead of failing."""
    calls = []
    monkeypatch.setattr(models, "prepare_default", lambda force=False: tmp_path)
    monkeypatch.setattr(cli.onnx, "export_onnx", lambda force=False: calls.append(force) or (tmp_path / "fp32", 12.0))
    assert cli.main(["prepare"]) == 0 and calls == [False]
    assert "ONNX export ready" in capsys.readouterr().out
    assert cli.main(["prepare", "--no-onnx"]) == 0 and calls == [False]
    missing = env.Capability("onnx-export", False, "", "not installed: pip install onnxscript")
    monkeypatch.setattr(cli.env, "capability", lambda name: missing)
    assert cli.main(["prepare", "--force"]) == 0 and calls == [False]
    assert "pip install onnxscript" in capsys.readouterr().out
