# Typical wrong answers to notebook 12's exercises: each must be called wrong, with a reason.

# %% exercise 12.choice_mask
def choice_mask(text, choices, vocab, eos_id):  # forgets the text so far: tokens that begin a choice, at every step
    allowed = [piece != "" and any(c.startswith(piece) for c in choices) for piece in vocab]
    allowed[eos_id] = text in choices
    return allowed


# %% exercise 12.choice_mask
def choice_mask(text, choices, vocab, eos_id):  # never lets the answer end
    return [piece != "" and any(c.startswith(text + piece) for c in choices) for piece in vocab]


# %% exercise 12.choice_mask
def choice_mask(text, choices, vocab, eos_id):  # only tokens that complete a choice: a choice of several tokens is never reached
    allowed = [text + piece in choices for piece in vocab]
    allowed[eos_id] = text in choices
    return allowed


# %% exercise 12.choice_mask
def choice_mask(text, choices, vocab, eos_id):  # allows the empty token
    allowed = [any(c.startswith(text + piece) for c in choices) for piece in vocab]
    allowed[eos_id] = text in choices
    return allowed


# %% exercise 12.choice_mask
def choice_mask(text, choices, vocab, eos_id):  # a choice that is the start of another never ends
    allowed = [piece != "" and any(c.startswith(text + piece) for c in choices) for piece in vocab]
    allowed[eos_id] = text in choices and not any(c != text and c.startswith(text) for c in choices)
    return allowed


# %% exercise 12.plan
def plan(prompt_tokens, threshold, prefill_up):  # ignores a prefill server that is down
    return ["prefill", "decode"] if prompt_tokens >= threshold else ["decode"]


# %% exercise 12.plan
def plan(prompt_tokens, threshold, prefill_up):  # the steps in the wrong order
    return ["decode", "prefill"] if prefill_up and prompt_tokens >= threshold else ["decode"]


# %% exercise 12.plan
def plan(prompt_tokens, threshold, prefill_up):  # a prompt of exactly the threshold stays local
    return ["prefill", "decode"] if prefill_up and prompt_tokens > threshold else ["decode"]


# %% exercise 12.plan
def plan(prompt_tokens, threshold, prefill_up):  # splits the short prompts, keeps the long ones
    return ["prefill", "decode"] if prefill_up and prompt_tokens < threshold else ["decode"]


# %% exercise 12.choice_mask
def choice_mask(text, choices, vocab, eos_id):  # a token anywhere inside a choice, not the start of one
    allowed = [len(p) > 0 and any((text + p) in c for c in choices) for p in vocab]
    allowed[eos_id] = text in choices
    return allowed
