"""Speculative decoding: guess several tokens cheaply, check them all in one forward pass of the model.

A decode step reads every weight to produce one token. A forward pass over k + 1 positions reads them
once too, and on memory-bound hardware costs little more. So: *draft* k tokens, run the model once over
the last token plus the draft, and keep the draft's longest prefix that matches what the model itself
would have chosen, plus the model's own token after it (the "bonus" token). With greedy decoding the
output is exactly the tokens plain decoding gives; only the number of forward passes changes.

prompt lookup   the draft is what followed the last n-gram the last time it appeared in the context
                (transformers: ``generate(..., prompt_lookup_num_tokens=k)``). Free, and good whenever
                the answer copies from the prompt: editing, extraction, code changes, summaries.
draft model     a smaller model sharing the tokenizer drafts the tokens (``assistant_model=``); it
                costs its own forward passes, so it pays off only when it is much faster than the
                target and agrees with it often.

``lookup_decode`` is the mechanism written out on ``labkit.decoding.decode``'s prefill; ``timed_generate`` runs
transformers' implementation and counts its forward passes.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.checks import positive
from ..core.timing import rounds
from . import quality
from .decode import prefill, verify
from .generation import TimingStreamer


def draft_from_context(ids: Sequence[int], max_ngram: int = 2, num_tokens: int = 10,
                       eos: Sequence[int] = ()) -> list[int]:
    """Prompt lookup's draft: find the last ``n`` tokens (n = max_ngram … 1) earlier in ``ids``, earliest
    occurrence first, and propose the up to ``num_tokens`` tokens that followed it. A draft stops before an
    end-of-sequence token. No match: an empty draft (the step decodes one token, as plain decoding does).
    The same rule as transformers' ``PromptLookupCandidateGenerator`` when end-of-sequence is forbidden
    (``min_new_tokens``, as in ``timed_generate``)."""
    positive("max_ngram", max_ngram)
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"num_tokens={num_tokens!r}: must be 0 (no draft) or a positive integer")
    ids = list(ids)
    if num_tokens == 0:
        return []
    for n in range(min(max_ngram, len(ids) - 1), 0, -1):
        tail = ids[-n:]
        for start in range(len(ids) - n):  # the occurrence at the very end has nothing after it
            if ids[start:start + n] == tail:
                follow = ids[start + n:start + n + num_tokens]
                stop = next((i for i, t in enumerate(follow) if t in eos), len(follow))
                if stop:  # an occurrence followed at once by end-of-sequence proposes nothing: try the next
                    return follow[:stop]
    return []


def accepted_length(draft: Sequence[int], predicted: Sequence[int]) -> int:
    """Greedy acceptance: how many draft tokens the model agrees with, counted from the start until the
    first disagreement. ``predicted[i]`` is the model's greedy token after the context plus ``draft[:i]``."""
    n = 0
    while n < len(draft) and n < len(predicted) and draft[n] == predicted[n]:
        n += 1
    return n


def accept(draft: Sequence[int], predicted: Sequence[int]) -> list[int]:
    """The tokens one verify pass adds: the accepted draft prefix, then the model's own next token (after a
    full match, the token after the whole draft; after a mismatch, the model's token in its place)."""
    n = accepted_length(draft, predicted)
    return [int(t) for t in draft[:n]] + [int(predicted[n])]


@dataclass
class LookupRun:
    """What one speculative decode produced and how many forward passes it took."""

    tokens: list[int]
    forward_passes: int  # the prefill counts as one
    drafted: int  # draft tokens proposed
    accepted: int  # draft tokens the model agreed with
    steps: list[dict[str, int]] = field(default_factory=list)  # per verify pass: drafted, accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_forward(self) -> float:
        return len(self.tokens) / self.forward_passes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate, "tokens_per_forward": self.tokens_per_forward}


def lookup_decode(model: Any, input_ids: Any, new_tokens: int = 32, num_tokens: int = 10, max_ngram: int = 2,
                  eos: Sequence[int] = (), draft_fn: Any = None) -> LookupRun:
    """Greedy decoding with prompt-lookup drafts, verified by the model in one pass each (batch of one).

    ``draft_fn(ids, max_ngram, num_tokens, eos)`` makes the drafts (default ``draft_from_context``).
    Returns exactly ``new_tokens`` tokens (end-of-sequence does not stop it): compare them with
    ``labkit.decoding.decode.greedy``.
    """
    import torch

    positive("new_tokens", new_tokens)
    positive("num_tokens", num_tokens)
    if input_ids.shape[0] != 1:
        raise ValueError(f"input_ids has batch {input_ids.shape[0]}: speculative decoding here runs one sequence")
    draft_fn = draft_fn or draft_from_context
    prompt = input_ids[0].tolist()
    run = LookupRun(tokens=[], forward_passes=1, drafted=0, accepted=0)
    with torch.inference_mode():
        logits, cache = prefill(model, input_ids)
        run.tokens.append(int(logits.argmax(-1)))
        while len(run.tokens) < new_tokens:
            ids = prompt + run.tokens
            room = new_tokens - len(run.tokens) - 1  # the bonus token always comes
            draft = list(draft_fn(ids, max_ngram, min(num_tokens, room), eos))[:room]
            x = torch.tensor([[run.tokens[-1], *draft]], device=input_ids.device)  # (1, 1 + d)
            predicted = verify(model, x, cache)[0].argmax(-1).tolist()  # (1 + d,): the model's token after each prefix
            new = accept(draft, predicted)
            n = len(new) - 1
            run.tokens += new
            # keep the KV of the accepted tokens only (the bonus token is fed next); crop takes how many to drop
            cache.crop(-(cache.get_seq_length() - (len(ids) + n)))
            run.forward_passes += 1
            run.drafted += len(draft)
            run.accepted += n
            run.steps.append({"drafted": len(draft), "accepted": n})
    return run


def timed_generate(model: Any, input_ids: Any, new_tokens: int, label: str = "", **gen_kwargs: Any) -> dict[str, Any]:
    """Greedy ``generate`` of exactly ``new_tokens`` tokens, timed by a streamer: tokens, forward passes,
    TTFT, decode time and decode tokens/s (tokens after the first forward pass / the time after it).
    ``gen_kwargs``: e.g. ``prompt_lookup_num_tokens=10`` or ``assistant_model=draft``."""
    import torch

    positive("new_tokens", new_tokens)
    streamer = TimingStreamer(input_ids.device)
    pad = model.generation_config.pad_token_id
    # exactly new_tokens: end-of-sequence forbidden (min_new_tokens); assisted decoding with a draft model
    # refuses that processor, so there it is switched off instead (no token stops the run)
    fixed = {"eos_token_id": None} if gen_kwargs.get("assistant_model") is not None else {"min_new_tokens": new_tokens}
    with torch.inference_mode():
        streamer.begin()
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=new_tokens, streamer=streamer, pad_token_id=pad, **fixed, **gen_kwargs)
    # assisted decoding may accept a few tokens past the limit in its last pass: keep exactly new_tokens
    tokens = out[0, input_ids.shape[1]:].tolist()[:new_tokens]
    assert streamer.puts, "generate produced no token"
    first_t, first_n = streamer.puts[0]
    last_t = streamer.puts[-1][0]
    after_first = len(tokens) - first_n
    decode_s = last_t - first_t
    return {"label": label, "tokens": tokens, "n_out": len(tokens), "forward_passes": len(streamer.puts),
            "tokens_per_forward": len(tokens) / len(streamer.puts), "ttft_s": first_t - streamer.start,
            "e2e_s": last_t - streamer.start, "decode_s": decode_s,
            "decode_tokens_per_s": after_first / decode_s if decode_s > 0 and after_first > 0 else None}


def compare_lookup(model: Any, input_ids: Any, new_tokens: int, num_tokens: int = 10, repeats: int = 3,
                   label: str = "", **extra: Any) -> dict[str, Any]:
    """Plain greedy ``generate`` against prompt lookup on the same prompt, in ``repeats`` interleaved rounds
    (``timing.rounds``: each round runs both, in a shuffled order, after one warmup of each): the median of each,
    forward passes, tokens per pass, decode speedup (every run's tokens/s kept in ``samples``, round i at index i,
    so the two sides pair up for a paired verdict), and whether the tokens are identical. ``extra`` goes to the
    prompt-lookup call only."""
    positive("repeats", repeats)
    kinds = {"plain": {}, "prompt lookup": {"prompt_lookup_num_tokens": num_tokens, **extra}}
    for kwargs in kinds.values():  # warmup: first calls pay allocation and lazy set-up
        timed_generate(model, input_ids, min(new_tokens, 4), **kwargs)
    runs = dict(rounds({k: (lambda k=k, kw=kw: timed_generate(model, input_ids, new_tokens, k, **kw))
                        for k, kw in kinds.items()}, repeats, again=False))
    med = {k: statistics.median(r["decode_s"] for r in rs) for k, rs in runs.items()}
    plain, lookup = runs["plain"][0], runs["prompt lookup"][0]
    tps = {k: statistics.median(r["decode_tokens_per_s"] or 0.0 for r in rs) for k, rs in runs.items()}
    return {"task": label, "prompt_tokens": int(input_ids.shape[1]), "new_tokens": new_tokens,
            "num_tokens": num_tokens, "repeats": repeats, "rounds_paired": True,  # samples: round i at index i
            "plain_forward_passes": plain["forward_passes"], "lookup_forward_passes": lookup["forward_passes"],
            "tokens_per_forward": lookup["tokens_per_forward"],
            "plain_decode_s": med["plain"], "lookup_decode_s": med["prompt lookup"],
            "plain_decode_tokens_per_s": tps["plain"], "lookup_decode_tokens_per_s": tps["prompt lookup"],
            "decode_speedup": tps["prompt lookup"] / tps["plain"] if tps["plain"] else None,
            "identical": all(quality.identical(r["tokens"], plain["tokens"]) for rs in runs.values() for r in rs),
            "tokens": plain["tokens"], "lookup_tokens": lookup["tokens"],
            "samples": {"plain_decode_tokens_per_s": [r["decode_tokens_per_s"] or 0.0 for r in runs["plain"]],
                        "lookup_decode_tokens_per_s": [r["decode_tokens_per_s"] or 0.0 for r in runs["prompt lookup"]]}}


# ----------------------------------------------------------------------------------------- draft models


def draft_pair_reason(target: Any, target_tokenizer: Any, draft: Any, draft_tokenizer: Any) -> str:
    """'' when ``draft`` can draft for ``target`` token for token (same vocabulary, same ids); else why not."""
    if draft is None:
        return "no draft model given"
    tv, dv = target.config.get_text_config().vocab_size, draft.config.get_text_config().vocab_size
    if tv != dv:
        return f"vocabulary sizes differ ({tv} vs {dv}): the draft's token ids mean other things to the target"
    if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        return "the tokenizers differ: a draft must share the target's tokenizer for token-level verification"
    t_dev, d_dev = next(target.parameters()).device, next(draft.parameters()).device
    if t_dev != d_dev:
        return f"the draft is on {d_dev}, the target on {t_dev}: load both on one device"
    return ""


def params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
