"""Quality of a model variant against the fp32 reference: perplexity, greedy agreement, KL.

Every function takes ``model``: either an HF-like causal LM (PyTorch, bitsandbytes, or
the lab's ONNX Runtime ``OrtCausalLM``, whose output has ``.logits``) or any callable that maps
``input_ids`` of shape (1, T) to logits of shape (1, T, V). ``logits_fn`` turns either into
the callable, so an ONNX Runtime session, a quantised model and the reference are scored by
the same code.

perplexity   exp(mean next-token negative log-likelihood) on ``data/eval/`` text, scored in
             fixed windows (``window_tokens``) that advance by ``stride_tokens``: each token is
             scored once, with up to ``window_tokens - stride_tokens`` tokens of context before it
agreement    the fraction of positions where the variant's argmax equals the reference's greedy token
kl           mean over positions of KL(reference || variant) of the next-token distributions, in nats
answers      two greedy answers compared, the one home of it: ``until_eos``, ``first_difference``,
             ``identical``, ``all_identical``, ``equal_tokens``, ``answers_check`` and its phrase ``check_line`` (every engine, server and bench
             script compares answers through these); ``divergence`` adds where two runs of one prompt part and the
             largest logit difference up to there
conforms     a JSON value against a JSON schema (``jsonschema``, from the [serving] extra): the one schema check of
             a structured answer (notebook 12) and of a tool call's arguments (notebook 13)
Agreement and KL are teacher-forced on the reference's own greedy continuation of each prompt,
so both models see exactly the same tokens and one early difference does not derail the rest.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.checks import model_device, positive
from ..model.models import chat_inputs
from . import generation

LogitsFn = Callable[[Any], Any]  # input_ids (1, T) int64 -> logits (1, T, V)


def logits_fn(model: Any) -> LogitsFn:
    """``input_ids -> fp32 logits on the CPU`` for an HF-like model or a plain logits callable."""
    import torch

    if not callable(model):
        raise ValueError(f"{type(model).__name__} is not callable: pass a causal LM or a function input_ids -> logits")
    hf_like = hasattr(model, "config") and hasattr(model, "generate")
    device = model_device(model) if hf_like else None

    def run(input_ids: Any) -> Any:
        ids = input_ids if device is None else input_ids.to(device)
        with torch.inference_mode():
            if hf_like:
                out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
            else:
                out = model(ids)
        logits = getattr(out, "logits", out)
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        assert logits.dim() == 3 and logits.shape[:2] == input_ids.shape, (
            f"logits shape {tuple(logits.shape)} does not match input_ids {tuple(input_ids.shape)}")
        return logits.detach().to("cpu", torch.float32)

    return run


# ---------------------------------------------------------------- perplexity


@dataclass
class Perplexity:
    perplexity: float
    nll_per_token: float  # nats
    n_tokens: int  # tokens scored
    n_windows: int
    window_tokens: int
    stride_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def perplexity(model: Any, token_ids: Sequence[int] | Any, window_tokens: int = 512,
               stride_tokens: int | None = None, max_tokens: int | None = None) -> Perplexity:
    """Perplexity of ``token_ids`` under ``model``, in windows of ``window_tokens``.

    The first window scores all its tokens but the first; each later window starts
    ``stride_tokens`` later (default: a whole window, i.e. plain chunks, overlapping by the one
    token needed as context) and scores only the tokens not scored before, so every token but
    the first counts exactly once. A smaller stride gives each token more context and costs more. ``max_tokens`` cuts the text first (quick mode).
    """
    import torch

    fn = logits_fn(model)
    ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
    positive("window_tokens", window_tokens)
    stride_tokens = window_tokens if stride_tokens is None else stride_tokens
    positive("stride_tokens", stride_tokens)
    if stride_tokens > window_tokens:
        raise ValueError(f"stride_tokens={stride_tokens} exceeds window_tokens={window_tokens}: tokens would be skipped")
    if max_tokens is not None:
        positive("max_tokens", max_tokens)
        ids = ids[:max_tokens]
    if ids.numel() < 2:
        raise ValueError(f"{ids.numel()} token(s): perplexity needs at least 2")
    nll_sum, n_scored, n_windows, scored_until = 0.0, 0, 0, 1  # token 0 has no prediction
    start = 0
    while scored_until < ids.numel():
        end = min(start + window_tokens, ids.numel())
        window = ids[start:end].unsqueeze(0)  # (1, w)
        logp = torch.log_softmax(fn(window)[0, :-1], dim=-1)  # (w-1, V): predictions of tokens 1..w-1
        targets = window[0, 1:]
        first = scored_until - start - 1  # index in ``targets`` of the first token not yet scored
        picked = logp[first:].gather(1, targets[first:, None]).squeeze(1)
        nll_sum -= float(picked.sum())
        n_scored += picked.numel()
        n_windows += 1
        scored_until = end
        start = min(start + stride_tokens, end - 1)  # keep at least one token of context
    assert n_scored == ids.numel() - 1, f"scored {n_scored} of {ids.numel() - 1} tokens"
    nll = nll_sum / n_scored
    return Perplexity(perplexity=math.exp(nll), nll_per_token=nll, n_tokens=n_scored, n_windows=n_windows,
                      window_tokens=window_tokens, stride_tokens=stride_tokens)


# ---------------------------------------------------------------- agreement and KL


@dataclass
class Reference:
    """The reference model's greedy continuations and its next-token log-probabilities on them."""

    prompts: list[str]
    sequences: list[Any]  # (1, n_prompt + n_new) int64 per prompt: prompt then greedy continuation
    n_prompt: list[int]
    logprobs: list[Any]  # (n_new, V) fp32: reference log-softmax at the positions predicting the continuation

    @property
    def n_tokens(self) -> int:
        return sum(lp.shape[0] for lp in self.logprobs)


def _scored_logits(fn: LogitsFn, seq: Any, n_prompt: int) -> Any:
    """Logits at the positions that predict the continuation tokens: (n_new, V)."""
    return fn(seq)[0, n_prompt - 1:-1]


def reference_from_ids(model: Any, sequences: Sequence[Any], n_prompt: Sequence[int],
                       prompt_list: Sequence[str] | None = None) -> Reference:
    """A reference from token sequences already made (prompt then continuation, each (1, T))."""
    import torch

    if len(sequences) != len(n_prompt) or not sequences:
        raise ValueError(f"{len(sequences)} sequences and {len(n_prompt)} prompt lengths: pass one of each, at least one")
    fn = logits_fn(model)
    seqs = [torch.as_tensor(s, dtype=torch.long).reshape(1, -1).cpu() for s in sequences]
    for seq, n in zip(seqs, n_prompt):
        if not 0 < n < seq.shape[1]:
            raise ValueError(f"prompt length {n} must leave at least one continuation token in {seq.shape[1]}")
    logprobs = [torch.log_softmax(_scored_logits(fn, seq, n), dim=-1) for seq, n in zip(seqs, n_prompt)]
    texts = list(prompt_list) if prompt_list is not None else [f"sequence {i}" for i in range(len(seqs))]
    return Reference(prompts=texts, sequences=seqs, n_prompt=list(n_prompt), logprobs=logprobs)


def reference(model: Any, tokenizer: Any, prompt_list: Sequence[str], new_tokens: int = 32) -> Reference:
    """Greedy-continue each chat prompt with ``model`` (the fp32 reference) and keep its log-probs."""
    import torch

    positive("new_tokens", new_tokens)
    if not prompt_list:
        raise ValueError("no prompts: pass at least one")
    device = str(model_device(model) or "cpu")  # a plain logits callable holds no tensors
    seqs, n_prompts = [], []
    for text in prompt_list:
        inputs = chat_inputs(tokenizer, text, device=device)
        n_prompt = inputs["input_ids"].shape[1]
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        seqs.append(out[:, : n_prompt + new_tokens].to("cpu"))
        n_prompts.append(n_prompt)
    return reference_from_ids(model, seqs, n_prompts, prompt_list)


@dataclass
class Agreement:
    agreement: float  # fraction of positions where the variant's argmax is the reference's greedy token
    kl: float  # mean KL(reference || variant), nats per token
    kl_max: float  # the worst single position
    n_tokens: int
    per_prompt: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def kl_divergence(ref_logprobs: Any, logits: Any) -> Any:
    """KL(P || Q) per position, in nats: P from reference log-probs, Q from logits; shape (n,)."""
    import torch

    q = torch.log_softmax(logits.float(), dim=-1)
    p = ref_logprobs.float()
    return (p.exp() * (p - q)).sum(dim=-1).clamp_min(0.0)  # clamp: rounding can give -1e-9


def compare(model: Any, ref: Reference) -> Agreement:
    """Teacher-force ``model`` on the reference's continuations: agreement and mean KL."""
    fn = logits_fn(model)
    agree_n, kl_sum, kl_max, n = 0, 0.0, 0.0, 0
    rows = []
    for text, seq, n_prompt, ref_lp in zip(ref.prompts, ref.sequences, ref.n_prompt, ref.logprobs):
        logits = _scored_logits(fn, seq, n_prompt)
        assert logits.shape == ref_lp.shape, f"variant logits {tuple(logits.shape)} vs reference {tuple(ref_lp.shape)}"
        targets = seq[0, n_prompt:]
        same = int((logits.argmax(dim=-1) == targets).sum())
        kl = kl_divergence(ref_lp, logits)
        rows.append({"prompt": text, "agreement": same / len(targets), "kl": float(kl.mean()), "n_tokens": len(targets)})
        agree_n += same
        kl_sum += float(kl.sum())
        kl_max = max(kl_max, float(kl.max()))
        n += len(targets)
    assert n == ref.n_tokens and n > 0
    return Agreement(agreement=agree_n / n, kl=kl_sum / n, kl_max=kl_max, n_tokens=n, per_prompt=rows)


# ---------------------------------------------------------------- answers side by side


def answers(model: Any, tokenizer: Any, questions: Sequence[str], max_new_tokens: int = 32) -> list[str]:
    """Greedy answers to chat questions (stops at end of sequence)."""
    return [generation.generate(model, tokenizer, q, max_new_tokens=max_new_tokens).text.strip() for q in questions]


def side_by_side(questions: Sequence[str], by_variant: dict[str, Sequence[str]], reference_name: str = "fp32"):
    """One row per question, one column per variant; a trailing '≠' marks an answer that differs
    from the reference's."""
    import pandas as pd

    if reference_name not in by_variant:
        raise ValueError(f"reference {reference_name!r} not among the answers; have {sorted(by_variant)}")
    ref = list(by_variant[reference_name])
    table: dict[str, list[str]] = {"question": list(questions)}
    for name, texts in by_variant.items():
        texts = list(texts)
        if len(texts) != len(questions):
            raise ValueError(f"{name}: {len(texts)} answers for {len(questions)} questions")
        table[name] = [t if name == reference_name or t == r else f"{t}  ≠" for t, r in zip(texts, ref)]
    return pd.DataFrame(table)


# ---------------------------------------------------------------- greedy tokens and agreement


class TokenRecorder:
    """A ``generate`` logits processor that keeps each step's greedy token, (B,) per step, on the device.

    ``generate`` runs custom processors after its own, so the argmax of the scores this one sees is the token
    greedy decoding picks. One argmax per step and no host copy: timing is not disturbed.
    """

    def __init__(self) -> None:
        self.steps: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.steps.append(scores.argmax(-1))
        return scores

    def kwargs(self) -> dict[str, Any]:
        """``generate`` keyword arguments that install this recorder."""
        from transformers import LogitsProcessorList

        return {"logits_processor": LogitsProcessorList([self])}

    @property
    def tokens(self) -> Any:
        """(B, steps) greedy tokens, on the host."""
        import torch

        if not self.steps:
            raise ValueError("no tokens recorded: pass recorder.kwargs() to generate first")
        return torch.stack(self.steps, dim=1).cpu()


def agreement(tokens: Any, baseline: Any) -> float:
    """Fraction of greedy tokens equal to the baseline's at the same position (1.0: identical answers).

    Greedy decoding is free-running: after a first different token the rest usually differ too."""
    import torch

    got, want = torch.as_tensor(tokens).cpu(), torch.as_tensor(baseline).cpu()
    if got.shape != want.shape or got.numel() == 0:
        raise ValueError(f"tokens {tuple(got.shape)} and baseline {tuple(want.shape)}: need the same, non-empty shape")
    return float((got == want).float().mean())


def token_agreement(tokenizer: Any, text: str, reference: str) -> float:
    """Share of the reference answer's tokens that ``text`` repeats at the same position (1.0: identical
    greedy answers). Both answers are re-encoded by ``tokenizer``; a missing token counts as a difference."""
    ref = tokenizer(reference, add_special_tokens=False)["input_ids"]
    got = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ref:
        return 1.0 if not got else 0.0
    return sum(a == b for a, b in zip(got, ref)) / max(len(ref), len(got))

# ------------------------------------------------------------------------ two greedy answers compared
# The one home of "are these the same answer?": every engine, server and bench script compares through here.


def until_eos(tokens: Sequence[int], eos: set[int]) -> list[int]:
    """A greedy answer up to its end-of-sequence token (excluded): what every engine is compared on."""
    out: list[int] = []
    for t in tokens:
        if t in eos:
            break
        out.append(int(t))
    return out


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first token position where two answers differ (a length difference counts); None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def identical(a: Sequence[int], b: Sequence[int], eos: set[int] = frozenset()) -> bool:
    """Whether two greedy answers are the same, each cut at end-of-sequence."""
    return first_difference(until_eos(a, eos), until_eos(b, eos)) is None


def all_identical(got: Sequence[Sequence[int]], ref: Sequence[Sequence[int]], eos: set[int] = frozenset()) -> bool:
    """Whether two lists of greedy answers are the same, answer for answer (as many, each ``identical``)."""
    return len(got) == len(ref) and all(identical(a, b, eos) for a, b in zip(got, ref))


def equal_tokens(got: Sequence[Sequence[int]], ref: Sequence[Sequence[int]]) -> tuple[int, int]:
    """Answers paired in order: (tokens equal at the same position, positions compared over the shorter of each
    pair)."""
    pairs = list(zip(got, ref))
    return (sum(a == b for x, y in pairs for a, b in zip(x, y)), sum(min(len(x), len(y)) for x, y in pairs))


def answers_check(got: Mapping[str, Sequence[int]], ref: Mapping[str, Sequence[int]],
                  eos: set[int]) -> dict[str, Any]:
    """Each named answer against its reference, both cut at end-of-sequence: identical for all, or where the first
    difference is (request name and token position), and which names only one side has."""
    diffs = {name: first_difference(until_eos(ids, eos), until_eos(ref[name], eos))
             for name, ids in got.items() if name in ref}
    differ = {name: pos for name, pos in diffs.items() if pos is not None}
    missing = sorted(set(got) ^ set(ref))
    return {"identical": not differ and not missing and bool(diffs), "compared": len(diffs),
            "first_differences": differ, "missing": missing}


def check_line(check: Mapping[str, Any]) -> str:
    """One phrase for an ``answers_check``: "identical (4 of 4)" or "differ: q2 from token 7"."""
    if check["identical"]:
        return f"identical ({check['compared']} of {check['compared']})"
    parts = [f"{name} from token {pos}" for name, pos in check["first_differences"].items()]
    parts += [f"{name} missing" for name in check["missing"]]
    return "differ: " + ", ".join(parts) if parts else "nothing compared"


@dataclass(frozen=True)
class Divergence:
    position: int | None  # the first token position where the answers differ; None when identical
    max_logit_diff: float | None  # the largest |logit difference| over the steps both scored, up to ``position``
    steps: int  # how many steps' logits were compared


def divergence(a: Sequence[int], b: Sequence[int], logits_a: Sequence[Any] = (), logits_b: Sequence[Any] = ()) -> Divergence:
    """Two greedy answers to one prompt (alone, and inside a batch; fp32 and bf16): the first position where they
    part (``first_difference``) and the largest absolute difference between their next-token logits, step by step,
    over the steps both runs produced up to and including that position (after it the two runs read different
    tokens, so their logits no longer answer the same question). ``logits_a``/``logits_b`` hold one vector per step
    (tensors or arrays of one vocabulary); leave them empty to compare tokens only."""
    pos = first_difference(a, b)
    last = min(len(logits_a), len(logits_b))
    if pos is not None:
        last = min(last, pos + 1)
    worst = None
    for x, y in zip(logits_a[:last], logits_b[:last]):
        if len(x) != len(y):
            raise ValueError(f"logits of one step differ in size ({len(x)} and {len(y)}): compare runs of one model")
        try:
            d = float(abs(x - y).max())  # tensors and arrays: one vectorised pass over the vocabulary
        except TypeError:  # plain lists of floats
            d = max(abs(float(p) - float(q)) for p, q in zip(x, y))
        worst = d if worst is None else max(worst, d)
    return Divergence(pos, worst, last)


def conforms(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether ``value``, already decoded from JSON, is valid against the JSON schema ``schema``. A schema that is
    itself invalid raises ``jsonschema.SchemaError``: the question is wrong, not the answer."""
    try:
        import jsonschema
    except ImportError as exc:
        raise ImportError("jsonschema is not installed here: `make setup` installs it with the lab's extras "
                          "(pip install 'labkit[serving]')") from exc
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True
