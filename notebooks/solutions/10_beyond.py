# Solutions to notebook 10's exercises (run by `python -m tools.run_notebooks --solutions` and tests/test_exercises.py).

# %% exercise 10.accept
def accept(draft, predicted):
    """draft: k proposed token ids; predicted: the model's greedy token after the context plus each prefix
    of the draft (k + 1 ids: after no draft token, after one, …, after all k).
    Return the tokens this verify pass adds to the answer."""
    n = 0
    while n < len(draft) and draft[n] == predicted[n]:  # accepted until the first disagreement
        n += 1
    return list(draft[:n]) + [predicted[n]]  # the model's own next token comes with the same pass


# %% exercise 10.reusable_prefix
def reusable_prefix(cached, prompt, block):
    """cached: the token ids of a prompt whose KV the cache holds; prompt: a new prompt's ids; block: the
    cache's block size. Return how many of the new prompt's positions can be taken from the cache."""
    limit = min(len(cached), len(prompt) - 1)  # the last prompt token is always prefilled: it gives the logits
    n = 0
    while n < limit and cached[n] == prompt[n]:
        n += 1
    return n // block * block  # whole blocks only


# %% exercise 10.quantize_kv
import torch


def quantize_kv(x):
    """x: (B, H, T, D) keys or values. Return (q, scale): q int8 of the same shape, scale (B, H, 1, D),
    one absmax scale per channel over the T tokens, so that q * scale ≈ x."""
    scale = x.abs().amax(dim=-2, keepdim=True).clamp_min(1e-8) / 127
    q = (x / scale).round().clamp(-127, 127).to(torch.int8)
    return q, scale
