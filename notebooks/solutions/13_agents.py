# Solutions to notebook 13's exercises (run by `python -m tools.run_notebooks --solutions` and tests/test_exercises.py).

# %% exercise 13.served_tokens
def served_tokens(prompts):
    """prompts: each request's prompt (token ids), in the order the server received them. Return, for each, the
    tokens a perfect prefix cache could serve: the longest prefix it shares with any earlier prompt."""
    served = []
    for i, new in enumerate(prompts):
        best = 0
        for old in prompts[:i]:
            n = 0
            while n < min(len(old), len(new)) and old[n] == new[n]:
                n += 1
            best = max(best, n)
        served.append(best)
    return served


# %% exercise 13.first_divergence
def first_divergence(old, new):
    """old, new: two consecutive chat requests of one session (OpenAI bodies with "tools" and "messages"). Return
    None when new extends old (the tools and every earlier message unchanged, as text), else the first field that
    differs in the order a template renders them: "tools", or "messages[k]"."""
    import json

    if json.dumps(old.get("tools")) != json.dumps(new.get("tools")):
        return "tools"
    for k, message in enumerate(old["messages"]):
        if k >= len(new["messages"]) or json.dumps(message) != json.dumps(new["messages"][k]):
            return f"messages[{k}]"
    return None


# %% exercise 13.spill
def spill(positions, crossover_tokens):
    """positions: an evicted prefix-cache entry's length; crossover_tokens: the length from which reloading beats
    recomputing on this machine (None: it never does). Return True to write the entry to the disk tier."""
    return crossover_tokens is not None and positions >= crossover_tokens
