# Typical wrong answers to notebook 11's exercises: each must be called wrong, with a reason.

# %% exercise 11.route
def route(prompt, cached, loads, threshold):  # ignores the load: always the longest prefix
    from labkit.serve.fleet.routing import common_prefix as shared
    best = [max((shared(prompt, p) for p in held), default=0) for held in cached]
    return best.index(max(best))


# %% exercise 11.route
def route(prompt, cached, loads, threshold):  # ignores the cache: always the least-loaded replica
    return loads.index(min(loads))


# %% exercise 11.route
def route(prompt, cached, loads, threshold):  # counts shared tokens anywhere, not a shared prefix
    best = [max((len(set(prompt) & set(p)) for p in held), default=0) for held in cached]
    choice = best.index(max(best))
    least = loads.index(min(loads))
    return least if loads[choice] - loads[least] > threshold else choice


# %% exercise 11.route
def route(prompt, cached, loads, threshold):  # compares the load with the threshold alone, not with the least-loaded
    from labkit.serve.fleet.routing import common_prefix as shared
    best = [max((shared(prompt, p) for p in held), default=0) for held in cached]
    choice = min((r for r in range(len(best)) if best[r] == max(best)), key=lambda r: (loads[r], r))
    return loads.index(min(loads)) if loads[choice] > threshold else choice


# %% exercise 11.knee
def knee(offered, goodput, follow):  # the rate of the highest goodput
    return max(zip(goodput, offered))[1]


# %% exercise 11.knee
def knee(offered, goodput, follow):  # stops at the first rate that does not follow, in the order given
    found = None
    for o, g in zip(offered, goodput):
        if g < follow * o:
            break
        found = o
    return found


# %% exercise 11.knee
def knee(offered, goodput, follow):  # the first rate that fails, instead of the last that follows
    for o, g in sorted(zip(offered, goodput)):
        if g < follow * o:
            return o
    return max(offered)


# %% exercise 11.knee
def knee(offered, goodput, follow):  # reads the sweep in the order given: the last rate listed that follows
    found = None
    for o, g in zip(offered, goodput):
        if g >= follow * o:
            found = o
    return found
