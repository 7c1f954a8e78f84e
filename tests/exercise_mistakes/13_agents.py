# Typical wrong answers to notebook 13's exercises: each must be called wrong, with a reason.

# %% exercise 13.served_tokens
def served_tokens(prompts):  # only the previous prompt: another session's shared system prompt is missed
    served = [0]
    for old, new in zip(prompts, prompts[1:]):
        n = 0
        while n < min(len(old), len(new)) and old[n] == new[n]:
            n += 1
        served.append(n)
    return served


# %% exercise 13.served_tokens
def served_tokens(prompts):  # counts shared tokens anywhere, not a prefix
    return [max((sum(a == b for a, b in zip(old, new)) for old in prompts[:i]), default=0)
            for i, new in enumerate(prompts)]


# %% exercise 13.served_tokens
def served_tokens(prompts):  # the whole earlier prompt whenever the first token matches
    return [max((len(old) for old in prompts[:i] if old[:1] == new[:1]), default=0) for i, new in enumerate(prompts)]


# %% exercise 13.first_divergence
def first_divergence(old, new):  # compares tool results as data: keys in another order look equal
    import json

    def data(message):
        return {**message, "content": json.loads(message["content"])} if message["role"] == "tool" else message

    if old.get("tools") != new.get("tools"):
        return "tools"
    for k, message in enumerate(old["messages"]):
        if k >= len(new["messages"]) or data(message) != data(new["messages"][k]):
            return f"messages[{k}]"
    return None


# %% exercise 13.first_divergence
def first_divergence(old, new):  # messages before tools: a template renders the tools first
    import json

    for k, message in enumerate(old["messages"]):
        if k >= len(new["messages"]) or json.dumps(message) != json.dumps(new["messages"][k]):
            return f"messages[{k}]"
    if json.dumps(old.get("tools")) != json.dumps(new.get("tools")):
        return "tools"
    return None


# %% exercise 13.first_divergence
def first_divergence(old, new):  # tools compared as a set of names: the order is what busts the cache
    import json

    if sorted(t["function"]["name"] for t in old["tools"]) != sorted(t["function"]["name"] for t in new["tools"]):
        return "tools"
    for k, message in enumerate(old["messages"]):
        if k >= len(new["messages"]) or json.dumps(message) != json.dumps(new["messages"][k]):
            return f"messages[{k}]"
    return None


# %% exercise 13.spill
def spill(positions, crossover_tokens):  # backwards: spills the short entries, drops the long ones
    return crossover_tokens is not None and positions < crossover_tokens


# %% exercise 13.spill
def spill(positions, crossover_tokens):  # forgets that a tier may never win
    return positions >= crossover_tokens


# %% exercise 13.spill
def spill(positions, crossover_tokens):  # the crossover itself is left out
    return crossover_tokens is not None and positions > crossover_tokens
