"""PagedAttention's memory argument, simulated: where KV-cache bytes go under three allocation policies.

    contiguous-max      one contiguous slab of ``max_model_len`` tokens per request, reserved up front
                        (a static-shaped cache: the request may grow to the model's limit)
    contiguous-reserve  one contiguous slab of prompt + ``max_tokens`` per request (what the client
                        allowed the answer to grow to), reserved up front
    paged               fixed-size blocks of ``block_size`` tokens, taken from a shared pool only when
                        the sequence reaches them (vLLM's PagedAttention); the last block is partly empty

Reserved minus used tokens is internal waste (fragmentation). Bytes follow from
``labkit.model.sizing.kv_bytes_per_token``. ``simulate`` replays the requests through a KV budget, step by
step (one token per running request per step), and reports how many run at once.

The block table itself is ``grow_table``: one more token for one sequence, a new block from the front of
the free list only when its last block is full. ``BlockAllocator`` runs on it, and ``replay_tables``
records every request's table step by step.
"""
from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ...core import config
from ...core.checks import positive

POLICIES: tuple[str, ...] = ("contiguous-max", "contiguous-reserve", "paged")
DEFAULT_BLOCK_SIZE = 16  # tokens per block: vLLM's default on GPUs
REQUESTS_FILE = "requests.json"


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"unknown allocation policy {policy!r}; choose one of {list(POLICIES)}")
    return policy


@dataclass(frozen=True)
class Request:
    """One request's lengths in tokens: the prompt, the answer it really got, and the client's limit."""

    id: str
    prompt_tokens: int
    answer_tokens: int
    max_tokens: int
    kind: str = ""
    prompt: str = ""

    def __post_init__(self) -> None:
        positive("prompt_tokens", self.prompt_tokens)
        positive("answer_tokens", self.answer_tokens)
        positive("max_tokens", self.max_tokens)
        if self.answer_tokens > self.max_tokens:
            raise ValueError(f"request {self.id}: answer_tokens={self.answer_tokens} exceeds max_tokens={self.max_tokens}")

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.answer_tokens


def load_requests(path: str | Path | None = None) -> list[Request]:
    """The requests in data/requests.json (prompt text, prompt/answer lengths of the default model)."""
    path = Path(path) if path is not None else config.DATA_DIR / REQUESTS_FILE
    if not path.is_file():
        raise ValueError(f"{path}: no requests file there; pass the path of a requests.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    fields = ("id", "prompt_tokens", "answer_tokens", "max_tokens", "kind", "prompt")
    return [Request(**{k: r[k] for k in fields if k in r}) for r in data["requests"]]


def repeat(requests: list[Request], n: int) -> list[Request]:
    """``n`` requests taken round-robin from ``requests`` (ids made unique): a bigger load of the same mix."""
    from dataclasses import replace

    if not requests:
        raise ValueError("no requests: pass at least one")
    return [replace(requests[i % len(requests)], id=f"{requests[i % len(requests)].id}#{i // len(requests)}")
            for i in range(positive("n", n))]


def blocks_for(tokens: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Blocks a sequence of ``tokens`` tokens occupies: ceil(tokens / block_size)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens={tokens!r}: must be 0 or a positive integer")
    return -(-tokens // positive("block_size", block_size))


def reserved_tokens(req: Request, policy: str, max_model_len: int, block_size: int = DEFAULT_BLOCK_SIZE,
                    length: int | None = None) -> int:
    """Token slots ``req`` holds under ``policy`` when its sequence is ``length`` tokens long
    (default: finished, prompt + answer). Contiguous policies hold their reservation from the start."""
    check_policy(policy)
    positive("max_model_len", max_model_len)
    if req.prompt_tokens + req.max_tokens > max_model_len:
        raise ValueError(f"request {req.id}: prompt {req.prompt_tokens} + max_tokens {req.max_tokens} exceeds "
                         f"max_model_len={max_model_len}; raise max_model_len")
    length = req.total_tokens if length is None else length
    if policy == "contiguous-max":
        return max_model_len
    if policy == "contiguous-reserve":
        return req.prompt_tokens + req.max_tokens
    return blocks_for(length, block_size) * block_size


def footprint(requests: list[Request], policy: str, kv_bytes_per_token: int, max_model_len: int,
              block_size: int = DEFAULT_BLOCK_SIZE) -> dict[str, Any]:
    """Reserved vs used KV bytes of every request at its full length, and the waste, under ``policy``."""
    if not requests:
        raise ValueError("no requests: pass at least one")
    positive("kv_bytes_per_token", kv_bytes_per_token)
    used = sum(r.total_tokens for r in requests)
    reserved = sum(reserved_tokens(r, policy, max_model_len, block_size) for r in requests)
    assert reserved >= used, f"{policy}: reserved {reserved} < used {used} tokens"
    return {"policy": policy, "requests": len(requests), "used_tokens": used, "reserved_tokens": reserved,
            "used_bytes": used * kv_bytes_per_token, "reserved_bytes": reserved * kv_bytes_per_token,
            "wasted_bytes": (reserved - used) * kv_bytes_per_token, "waste_fraction": 1 - used / reserved,
            "block_size": block_size if policy == "paged" else None, "max_model_len": max_model_len}


def fit_count(requests: list[Request], policy: str, budget_bytes: int, kv_bytes_per_token: int, max_model_len: int,
              block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """How many requests (taken round-robin from ``requests``) fit in ``budget_bytes`` of KV cache at once,
    each at its full length, under ``policy``."""
    if not requests:
        raise ValueError("no requests: pass at least one")
    positive("budget_bytes", budget_bytes)
    positive("kv_bytes_per_token", kv_bytes_per_token)
    budget_tokens = budget_bytes // kv_bytes_per_token
    per_round = sum(reserved_tokens(r, policy, max_model_len, block_size) for r in requests)
    rounds, left = divmod(budget_tokens, per_round)
    n = rounds * len(requests)
    for r in requests:
        need = reserved_tokens(r, policy, max_model_len, block_size)
        if need > left:
            break
        left -= need
        n += 1
    return n


def grow_table(table: list[int], length: int, free: list[int] | deque[int], block_size: int = DEFAULT_BLOCK_SIZE
               ) -> list[int]:
    """The block table of a ``length``-token sequence after it gains one token.

    The token goes to slot ``length % block_size`` of the last block; only when that block is full
    (``length`` a multiple of ``block_size``, including the empty sequence) does the sequence take a new
    block: the first of ``free``, removed from it. ``table`` is extended in place and returned.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length={length!r}: must be 0 or a positive integer")
    if len(table) != blocks_for(length, block_size):
        raise ValueError(f"a {length}-token sequence holds {blocks_for(length, block_size)} blocks of "
                         f"{block_size}, but its table has {len(table)}: {table}")
    if length % block_size == 0:  # the last block is full (or there is none yet)
        if not free:
            raise ValueError("no free block left in the pool: free a sequence (or preempt one) first")
        table.append(free.popleft() if isinstance(free, deque) else free.pop(0))
    return table


class BlockAllocator:
    """A shared pool of ``num_blocks`` blocks of ``block_size`` tokens; each sequence has a block table.

    ``allocate`` takes the blocks a prompt needs, ``append`` grows a sequence by one token (a new block
    only when its last one is full), ``free`` returns all of a sequence's blocks to the pool.
    """

    def __init__(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.num_blocks = positive("num_blocks", num_blocks)
        self.block_size = positive("block_size", block_size)
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[str, list[int]] = {}
        self._lengths: dict[str, int] = {}

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_tokens(self) -> int:
        return sum(self._lengths.values())

    @property
    def reserved_tokens(self) -> int:
        return (self.num_blocks - self.free_blocks) * self.block_size

    def table(self, seq_id: str) -> list[int]:
        if seq_id not in self._tables:
            raise ValueError(f"no sequence {seq_id!r} in the pool; allocate it first")
        return list(self._tables[seq_id])

    def allocate(self, seq_id: str, tokens: int) -> bool:
        """Blocks for a new sequence of ``tokens`` tokens; False (nothing taken) when the pool is short."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already holds blocks; free it first")
        positive("tokens", tokens)
        need = blocks_for(tokens, self.block_size)
        if need > self.free_blocks:
            return False
        self._tables[seq_id] = [self._free.popleft() for _ in range(need)]
        self._lengths[seq_id] = tokens
        return True

    def append(self, seq_id: str) -> bool:
        """One more token for ``seq_id``; False (nothing changed) when it needs a block and none is free."""
        length = self._lengths.get(seq_id)
        if length is None:
            raise ValueError(f"no sequence {seq_id!r} in the pool; allocate it first")
        if length % self.block_size == 0 and not self._free:  # it needs a block and the pool is empty
            return False
        grow_table(self._tables[seq_id], length, self._free, self.block_size)
        self._lengths[seq_id] = length + 1
        return True

    def free(self, seq_id: str) -> None:
        if seq_id not in self._tables:
            raise ValueError(f"no sequence {seq_id!r} in the pool")
        self._free.extend(self._tables.pop(seq_id))
        del self._lengths[seq_id]


def replay_tables(requests: list[Request], num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE
                  ) -> list[dict[str, Any]]:
    """Every request's block table, step by step, in a pool of ``num_blocks`` blocks.

    All requests are admitted in order (each prompt's blocks taken at once, as its prefill writes the
    whole prompt), then every step adds one token to each request not yet at its full length. Returns
    one row per moment: ``step`` (0: after the prefills), each request's table, and the free blocks left.
    """
    if not requests:
        raise ValueError("no requests: pass at least one")
    pool = BlockAllocator(num_blocks, block_size)
    for r in requests:
        if not pool.allocate(r.id, r.prompt_tokens):
            raise ValueError(f"{num_blocks} blocks of {block_size} cannot hold the prompts; raise num_blocks")
    rows = [{"step": 0, **{r.id: pool.table(r.id) for r in requests}, "free_blocks": pool.free_blocks}]
    for step in range(1, max(r.answer_tokens for r in requests) + 1):
        for r in requests:
            if step <= r.answer_tokens and not pool.append(r.id):
                raise ValueError(f"the pool ran out of blocks at step {step}; raise num_blocks")
        rows.append({"step": step, **{r.id: pool.table(r.id) for r in requests}, "free_blocks": pool.free_blocks})
    return rows


@dataclass
class SimResult:
    """What ``simulate`` saw: steps to finish everything and how full the batch and the budget were."""

    policy: str
    budget_tokens: int
    requests: int
    steps: int
    mean_running: float
    max_running: int
    mean_used_fraction: float  # tokens really stored ÷ budget, averaged over steps
    mean_waste_fraction: float  # (reserved − used) ÷ reserved, averaged over steps
    preemptions: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def simulate(requests: list[Request], policy: str, budget_tokens: int, max_model_len: int,
             block_size: int = DEFAULT_BLOCK_SIZE, max_running: int | None = None) -> SimResult:
    """Replay ``requests`` (all waiting at the start, first come first served) through a KV budget, in the order
    vLLM's scheduler works.

    Each step, every running request first stores the KV of the token it chose last step (paged: a new block
    when its last one is full). One that finds no free block preempts the newest running request: its blocks are
    freed and it goes back to the head of the queue, to be recomputed from its tokens so far (vLLM's recompute
    preemption); in a step that preempted, nobody is admitted. Otherwise waiting requests are admitted in order
    while their reservation fits (paged: the blocks of their prompt and the tokens they had made) and their
    prefill runs. Every request that ran chooses one token; it leaves when its answer is complete. The last
    token's KV is never stored: a finished sequence held prompt + answer − 1 tokens.
    """
    check_policy(policy)
    if not requests:
        raise ValueError("no requests: pass at least one")
    positive("budget_tokens", budget_tokens)
    cap = positive("max_running", max_running) if max_running is not None else None
    biggest = max(reserved_tokens(r, policy, max_model_len, block_size) for r in requests)
    if biggest > budget_tokens:
        raise ValueError(f"budget_tokens={budget_tokens} cannot hold even one request under {policy} "
                         f"(needs {biggest}); raise the budget")
    waiting: deque[tuple[Request, int]] = deque((r, 0) for r in requests)  # (request, tokens generated)
    running: list[tuple[Request, int]] = []
    pool = BlockAllocator(budget_tokens // block_size, block_size) if policy == "paged" else None
    reserved = 0  # contiguous policies: tokens reserved by running requests
    steps = preemptions = peak = 0
    sum_running = sum_used = sum_waste = 0.0
    while waiting or running:
        preempted = False
        i = 0
        while pool is not None and i < len(running):  # the running store last step's token, oldest first
            r, _ = running[i]
            if pool.append(r.id):
                i += 1
                continue
            victim = running.pop()  # the newest request gives its blocks back
            pool.free(victim[0].id)
            waiting.appendleft(victim)
            preemptions += 1
            preempted = True  # retry r with the freed blocks (or stop, if r itself was the victim)
        while not preempted and waiting and (cap is None or len(running) < cap):  # admit in order while it fits
            r, done = waiting[0]
            if pool is not None:
                if not pool.allocate(r.id, r.prompt_tokens + done):  # prefill: the prompt and any recomputed tokens
                    break
            else:
                need = reserved_tokens(r, policy, max_model_len, block_size)
                if reserved + need > budget_tokens:
                    break
                reserved += need
            running.append(waiting.popleft())
        assert running or preempted, "nothing running although one request alone fits"
        running = [(r, done + 1) for r, done in running]  # every request that ran chose one token
        if running:
            steps += 1
            used = (pool.used_tokens if pool is not None  # KV stored: all but the token each just chose
                    else sum(r.prompt_tokens + d - 1 for r, d in running))
            held = (pool.reserved_tokens if pool is not None
                    else sum(reserved_tokens(r, policy, max_model_len, block_size) for r, _ in running))
            sum_running += len(running)
            peak = max(peak, len(running))
            sum_used += used / budget_tokens
            sum_waste += 1 - used / held
        for r, done in running:
            if done < r.answer_tokens:
                continue
            if pool is not None:
                pool.free(r.id)
            else:
                reserved -= reserved_tokens(r, policy, max_model_len, block_size)
        running = [(r, done) for r, done in running if done < r.answer_tokens]
    return SimResult(policy=policy, budget_tokens=budget_tokens, requests=len(requests), steps=steps,
                     mean_running=sum_running / steps, max_running=peak, mean_used_fraction=sum_used / steps,
                     mean_waste_fraction=sum_waste / steps, preemptions=preemptions)


def compare(requests: list[Request], kv_bytes_per_token: int, budget_bytes: int, max_model_len: int,
            block_size: int = DEFAULT_BLOCK_SIZE) -> list[dict[str, Any]]:
    """One row per policy: footprint of all requests, how many fit in the budget, and the replay."""
    rows = []
    budget_tokens = budget_bytes // positive("kv_bytes_per_token", kv_bytes_per_token)
    for policy in POLICIES:
        row = footprint(requests, policy, kv_bytes_per_token, max_model_len, block_size)
        row["fit_in_budget"] = fit_count(requests, policy, budget_bytes, kv_bytes_per_token, max_model_len, block_size)
        sim = simulate(requests, policy, budget_tokens, max_model_len, block_size)
        row.update(budget_bytes=budget_bytes, sim_steps=sim.steps, sim_mean_running=sim.mean_running,
                   sim_max_running=sim.max_running, sim_waste_fraction=sim.mean_waste_fraction,
                   sim_preemptions=sim.preemptions)
        rows.append(row)
    return rows


def mean_blocks_wasted(requests: list[Request], block_size: int = DEFAULT_BLOCK_SIZE) -> float:
    """Mean empty slots in each finished sequence's last block (paged waste per request, < block_size)."""
    if not requests:
        raise ValueError("no requests: pass at least one")
    return sum(blocks_for(r.total_tokens, block_size) * block_size - r.total_tokens for r in requests) / len(requests)


def length_stats(requests: list[Request]) -> dict[str, float]:
    """Mean and extremes of prompt and answer lengths (tokens)."""
    if not requests:
        raise ValueError("no requests: pass at least one")
    p = [r.prompt_tokens for r in requests]
    a = [r.answer_tokens for r in requests]
    return {"requests": len(requests), "prompt_mean": sum(p) / len(p), "prompt_max": max(p), "prompt_min": min(p),
            "answer_mean": sum(a) / len(a), "answer_max": max(a), "answer_min": min(a),
            "max_tokens_mean": sum(r.max_tokens for r in requests) / len(requests)}
