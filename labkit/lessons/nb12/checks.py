"""Checks for notebook 12 (serving features): the token mask of a choice among strings, and the disaggregated
proxy's routing decision."""
from __future__ import annotations

from typing import Any

from ..exercises import Wrong, call, exercise

_VOCAB = ["<eos>", "y", "ye", "yes", "es", "s", "n", "no", "o", "ne", "none", "", "x", "yess", "maybe", " yes"]
_EOS = 0


def _allowed(got: Any, what: str) -> list[bool]:
    try:
        values = [bool(v) for v in (got.tolist() if hasattr(got, "tolist") else list(got))]
    except TypeError:
        raise Wrong(f"{what}: return one True/False per vocabulary entry (a list or a bool tensor), "
                    f"got {type(got).__name__}") from None
    if len(values) != len(_VOCAB):
        raise Wrong(f"{what}: return one entry per vocabulary entry ({len(_VOCAB)}), got {len(values)}")
    return values


def _names(flags: list[bool]) -> list[str]:
    return [repr(_VOCAB[i]) for i, f in enumerate(flags) if f]


@exercise("12.choice_mask", "token mask for a choice among strings", hints=(
    "A token may come next when the text so far plus the token's text is the start of some choice. Test the "
    "text so far with the token added, not the token alone, and test a start, not a whole choice: an answer "
    "several tokens long is reached one token at a time.",
    "Two tokens are special. End-of-sequence is allowed exactly when the text is already a whole choice, even "
    "when it is also the start of a longer one ('no' among 'no' and 'none'). The empty token is the start of "
    "every string, so it would always pass the test: refuse it, or a decode could pick it forever.",
    "For each token's text: allowed when it is not empty and the text so far followed by it is the beginning of at "
    "least one choice (`str.startswith`, with `any` over the choices). End-of-sequence is the exception: "
    "`allowed[eos_id]` is whether the text so far already is a whole choice.",
))
def _choice_mask(fn: Any) -> None:
    cases = [  # (text so far, choices, what it tests)
        ("", ["yes", "no"], "the start: any token that begins a choice"),
        ("y", ["yes", "no"], "after 'y': tokens that continue 'yes', not ones that begin it again"),
        ("ye", ["yes", "no"], "one letter left: 's' and 'es'... only 's' fits after 'ye'"),
        ("yes", ["yes", "no"], "a whole choice: end-of-sequence, and nothing that runs past it"),
        ("no", ["no", "none"], "'no' is a choice and the start of another: end-of-sequence and 'ne' both"),
        ("", ["maybe"], "a choice one token long"),
        ("x", ["yes", "no"], "text that left every choice: nothing is allowed"),
    ]
    for i, (text, choices, why) in enumerate(cases):
        args = (text, list(choices), list(_VOCAB), _EOS)
        got = call(fn, *args) if i == 0 else fn(*args)
        allowed = _allowed(got, f"text {text!r}")
        want = [bool(p) and any(c.startswith(text + p) for c in choices) for p in _VOCAB]
        want[_EOS] = text in choices
        if allowed == want:
            continue
        if allowed[_EOS] != want[_EOS]:
            raise Wrong(f"text {text!r}, choices {choices}: end-of-sequence (id {_EOS}) is "
                        f"{'allowed' if allowed[_EOS] else 'refused'}; it must be allowed exactly when the text is "
                        f"already a whole choice ({why}).", hint=2)
        if allowed[_VOCAB.index("")]:
            raise Wrong("the empty token is allowed: it adds nothing, so a decode could pick it forever; refuse "
                        "tokens whose text is empty", hint=2)
        extra = [a and not w for a, w in zip(allowed, want)]
        missing = [w and not a for a, w in zip(allowed, want)]
        raise Wrong(f"text {text!r}, choices {choices} ({why}): "
                    + (f"allowed {', '.join(_names(extra))}, which cannot lead to a choice; " if any(extra) else "")
                    + (f"refused {', '.join(_names(missing))}, which can; " if any(missing) else "")
                    + "a token is allowed when the text so far plus the token's text is the start of some choice",
                    hint=1)


@exercise("12.plan", "the disaggregated proxy's routing decision", hints=(
    "Split a request only when both hold: the prompt is long enough to be worth the transfer, and the prefill "
    "server answers. Otherwise the decode server does everything, prefill included. A split lists the prefill "
    "server first, since it writes the KV that the decode server then reads.",
    "Two conditions must both hold to split: the prefill server is up, and the prompt is long enough, where exactly "
    "threshold tokens already counts as long enough (`>=`). A split plan lists both servers in the order a request "
    "visits them; every other request goes to the decode server alone.",
))
def _pd_route(fn: Any) -> None:
    split, local = ["prefill", "decode"], ["decode"]
    cases = [  # (prompt tokens, threshold, prefill server up, expected, what it tests, the hint for it)
        (512, 256, True, split, "a long prompt with the prefill server up: prefill there, then decode here", 1),
        (64, 256, True, local, "a short prompt: its prefill costs less than the transfer, the decode server does it",
         1),
        (512, 256, False, local, "the prefill server is down: the decode server recomputes the prompt itself", 1),
        (256, 256, True, split, "a prompt of exactly the threshold is long enough to split", 2),
        (255, 256, True, local, "one token below the threshold stays local", 2),
        (0, 0, True, split, "threshold 0: every request is split", 2),
    ]
    for i, (n, threshold, up, want, why, hint) in enumerate(cases):
        got = call(fn, n, threshold, up) if i == 0 else fn(n, threshold, up)
        if not isinstance(got, (list, tuple)) or not all(isinstance(s, str) for s in got):
            raise Wrong(f"return the steps as a list of names, e.g. {split} or {local}; got {got!r}", hint=1)
        if list(got) == want:
            continue
        if list(got) == ["decode", "prefill"]:
            raise Wrong("the steps are in the wrong order: the prefill server writes the KV that the decode server "
                        "then reads", hint=1)
        raise Wrong(f"{n} prompt tokens, threshold {threshold}, prefill server {'up' if up else 'down'}: you returned "
                    f"{list(got)}, expected {want} ({why}).", hint=hint)
