# Solutions to notebook 12's exercises (run by `python -m tools.run_notebooks --solutions` and tests/test_exercises.py).

# %% exercise 12.choice_mask
def choice_mask(text, choices, vocab, eos_id):
    """text: what the constrained decode has written so far; choices: the strings the answer must be one of;
    vocab[i]: the text of token i; eos_id: the end-of-sequence token. Return one True/False per token:
    True where the token may come next."""
    allowed = [piece != "" and any(c.startswith(text + piece) for c in choices) for piece in vocab]
    allowed[eos_id] = text in choices  # the answer may end only once it is a whole choice
    return allowed


# %% exercise 12.plan
def plan(prompt_tokens, threshold, prefill_up):
    """prompt_tokens: the request's prompt length; threshold: the shortest prompt worth prefilling on the
    prefill server; prefill_up: whether that server answers. Return the servers to send the request to, in
    order: ["prefill", "decode"] or ["decode"]."""
    if prefill_up and prompt_tokens >= threshold:
        return ["prefill", "decode"]
    return ["decode"]
