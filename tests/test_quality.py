"""labkit.decoding.quality on inputs whose answers can be checked by hand, plus tiny random Llama models."""
from __future__ import annotations

import math

import pytest
import torch

from labkit.model import prompts
from labkit.decoding import quality

V = 50  # vocabulary of the hand-made logits functions


def uniform(ids: torch.Tensor) -> torch.Tensor:
    return torch.zeros(ids.shape[0], ids.shape[1], V)


def successor(logit: float):
    """Puts ``logit`` on token (x + 1) % V after x, 0 elsewhere: p(next) = e^L / (e^L + V - 1)."""
    def fn(ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(ids.shape[0], ids.shape[1], V)
        out.scatter_(2, ((ids + 1) % V).unsqueeze(-1), logit)
        return out
    return fn


@pytest.mark.parametrize("window,stride", [(512, None), (16, 16), (16, 5), (7, 1)])
def test_uniform_model_has_perplexity_equal_to_vocab_size(window, stride):
    ids = torch.randint(0, V, (100,), generator=torch.Generator().manual_seed(0))
    ppl = quality.perplexity(uniform, ids, window_tokens=window, stride_tokens=stride)
    assert ppl.perplexity == pytest.approx(V, rel=1e-5)
    assert ppl.n_tokens == 99  # every token but the first, each exactly once


def test_successor_model_perplexity_matches_hand_computation():
    ids = torch.arange(60) % V  # each token is its predecessor + 1
    logit = 3.0
    p = math.exp(logit) / (math.exp(logit) + V - 1)
    for window, stride in ((60, 60), (10, 3)):
        ppl = quality.perplexity(successor(logit), ids, window_tokens=window, stride_tokens=stride)
        assert ppl.perplexity == pytest.approx(1 / p, rel=1e-5)


def test_max_tokens_and_bad_arguments():
    ids = list(range(40))
    assert quality.perplexity(uniform, ids, window_tokens=8, max_tokens=10).n_tokens == 9
    with pytest.raises(ValueError, match="stride_tokens"):
        quality.perplexity(uniform, ids, window_tokens=8, stride_tokens=9)
    with pytest.raises(ValueError, match="window_tokens"):
        quality.perplexity(uniform, ids, window_tokens=0)
    with pytest.raises(ValueError, match="at least 2"):
        quality.perplexity(uniform, [3], window_tokens=8)


def test_kl_divergence_by_hand():
    p = torch.tensor([[0.5, 0.5]])
    q = torch.tensor([[0.9, 0.1]])
    kl = quality.kl_divergence(p.log(), q.log())
    assert float(kl[0]) == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1), rel=1e-6)
    assert float(quality.kl_divergence(p.log(), p.log())[0]) == 0.0


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def _greedy(model, prompt: torch.Tensor, new_tokens: int = 15) -> torch.Tensor:
    """Plain greedy decoding, one full forward per token (no cache): the reference continuation."""
    seq = prompt
    with torch.no_grad():
        for _ in range(new_tokens):
            seq = torch.cat([seq, model(seq).logits[:, -1:].argmax(-1)], dim=1)
    return seq


def _sequences(n: int = 3, length: int = 20):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (1, length), generator=g) for _ in range(n)], [5] * n


def test_identical_models_agree_fully_with_zero_kl():
    model = _tiny_llama()
    seqs, n_prompt = _sequences()
    # the reference's own continuation must be its greedy choice for agreement to mean anything
    greedy = [_greedy(model, s[:, :n]) for s, n in zip(seqs, n_prompt)]
    ref = quality.reference_from_ids(model, greedy, n_prompt)
    result = quality.compare(model, ref)
    assert result.agreement == 1.0
    assert result.kl == pytest.approx(0.0, abs=1e-7)
    assert result.n_tokens == sum(s.shape[1] - n for s, n in zip(greedy, n_prompt))


def test_perturbed_model_agrees_less_and_diverges():
    model = _tiny_llama()
    seqs, n_prompt = _sequences()
    greedy = [_greedy(model, s[:, :n]) for s, n in zip(seqs, n_prompt)]
    ref = quality.reference_from_ids(model, greedy, n_prompt)
    noisy = _tiny_llama()
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    result = quality.compare(noisy, ref)
    assert result.kl > 0.01
    assert result.agreement < 1.0
    # and worse perplexity on text the reference itself finds likely
    ids = torch.cat([g[0] for g in greedy])
    assert quality.perplexity(noisy, ids, window_tokens=20).perplexity > quality.perplexity(model, ids, window_tokens=20).perplexity


def test_hf_model_and_its_logits_callable_give_the_same_perplexity():
    model = _tiny_llama()
    ids = torch.randint(0, 64, (50,), generator=torch.Generator().manual_seed(2))
    a = quality.perplexity(model, ids, window_tokens=16, stride_tokens=8)
    b = quality.perplexity(lambda x: model(x).logits, ids, window_tokens=16, stride_tokens=8)
    assert a.perplexity == pytest.approx(b.perplexity, rel=1e-6)
    # a single window that covers the text equals one direct cross-entropy pass
    full = quality.perplexity(model, ids, window_tokens=64)
    with torch.no_grad():
        logits = model(ids[None]).logits[0, :-1]
    direct = torch.nn.functional.cross_entropy(logits, ids[1:])
    assert full.perplexity == pytest.approx(math.exp(float(direct)), rel=1e-5)


def test_side_by_side_marks_changed_answers():
    df = quality.side_by_side(["q1", "q2"], {"fp32": ["Paris.", "8"], "nf4": ["Le Grand Paris", "8"]})
    assert list(df["nf4"]) == ["Le Grand Paris  ≠", "8"]
    with pytest.raises(ValueError, match="reference"):
        quality.side_by_side(["q1"], {"nf4": ["x"]})
    with pytest.raises(ValueError, match="answers"):
        quality.side_by_side(["q1", "q2"], {"fp32": ["x"]})


def test_reference_from_ids_rejects_empty_continuations():
    model = _tiny_llama()
    with pytest.raises(ValueError, match="continuation"):
        quality.reference_from_ids(model, [torch.zeros(1, 5, dtype=torch.long)], [5])


def test_prompt_sets_and_eval_text():
    assert len(prompts.load_prompts("questions")) >= 2
    with pytest.raises(ValueError, match="questions"):
        prompts.load_prompts("nope")
    text = prompts.eval_text()
    assert any("\u4e00" <= c <= "\u9fff" for c in text), "the evaluation text needs Chinese paragraphs"
    assert len(text.split()) > 2000
    with pytest.raises(ValueError, match="labkit_eval.txt"):
        prompts.eval_text(prompts.EVAL_DIR / "missing.txt")


@pytest.mark.slow
def test_eval_text_is_at_least_3000_tokens_with_the_default_tokenizer():
    from labkit.model import models

    assert len(prompts.eval_tokens(models.load_tokenizer())) >= 3000


# ------------------------------------------------------------------- conforms: the one JSON schema check

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_conforms_checks_a_decoded_value_against_its_schema():
    assert quality.conforms({"name": "Ada", "age": 36}, PERSON)
    assert not quality.conforms({"name": "Ada"}, PERSON), "age is required"
    assert not quality.conforms({"name": "Ada", "age": "36"}, PERSON), "age is an integer"
    assert not quality.conforms({"name": "Ada", "age": 36, "city": "London"}, PERSON), "no other properties"
    assert not quality.conforms('{"name": "Ada", "age": 36}', PERSON), "text is not decoded here"
    assert quality.conforms([1, 2], {"type": "array", "items": {"type": "integer"}})


def test_a_schema_that_is_itself_wrong_raises_rather_than_failing_the_answer():
    import jsonschema

    with pytest.raises(jsonschema.SchemaError):
        quality.conforms({"colour": "red"}, {"type": "object", "properties": {"colour": {"type": "colour"}}})


def _imports_jsonschema(path):
    import ast

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n.split(".")[0] == "jsonschema" for n in names):
            return True
    return False


def test_jsonschema_is_imported_in_one_place_and_declared_in_the_extra_that_needs_it():
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [p for pkg in ("labkit", "tools", "bench") for p in sorted((root / pkg).rglob("*.py"))]
    assert len(files) > 100, "the scan must see the sources"
    assert [str(p.relative_to(root)) for p in files if _imports_jsonschema(p)] == ["labkit/decoding/quality.py"]
    extras = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(re.match(r"jsonschema\b", r) for r in extras["serving"]), "declare jsonschema in the [serving] extra"
    assert any("serving" in r for r in extras["lab"] if r.startswith("labkit[")), "[lab] brings [serving]"
