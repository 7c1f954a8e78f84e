# Solutions to notebook 11's exercises (run by `python -m tools.run_notebooks --solutions` and tests/test_exercises.py).

# %% exercise 11.route
def route(prompt, cached, loads, threshold):
    """prompt: the request (token ids or text); cached[r]: the prompts replica r was sent before;
    loads[r]: replica r's requests in flight; threshold: how many more than the least-loaded replica's
    a replica may have and still get the request. Return the chosen replica's index."""
    def shared(a, b):  # length of the common prefix
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    best = [max((shared(prompt, p) for p in held), default=0) for held in cached]
    longest = [r for r in range(len(cached)) if best[r] == max(best)]
    choice = min(longest, key=lambda r: (loads[r], r))  # ties: the less loaded, then the lower index
    least = min(range(len(loads)), key=lambda r: (loads[r], r))
    return least if loads[choice] - loads[least] > threshold else choice


# %% exercise 11.knee
def knee(offered, goodput, follow):
    """offered: the offered rates (req/s) of a sweep, in any order; goodput: the goodput at each (req/s);
    follow: a fraction. Return the knee's offered rate, or None when no rate's goodput follows it."""
    found = None
    for o, g in sorted(zip(offered, goodput)):  # by rising offered rate
        if g >= follow * o:
            found = o  # the last rate that still follows
    return found
