"""Notebook 07's checks: PagedAttention's block arithmetic and its block table."""
from __future__ import annotations

from typing import Any

from ..exercises import Wrong, call, exercise

_BLOCK_CASES = ((1, 16), (15, 16), (16, 16), (17, 16), (33, 16), (48, 16), (5, 4), (8, 4), (1, 1), (7, 1), (0, 16))


@exercise("07.blocks_needed", "blocks a sequence needs", hints=(
    "A sequence holds whole blocks, and its last block may be partly empty: the count is tokens / block_size "
    "rounded up, not down. A sequence of 0 tokens holds 0 blocks.",
    "Rounding up is not `tokens // block_size + 1`: that takes one block too many whenever tokens is an exact "
    "multiple of block_size (16 tokens fill exactly one block of 16), and gives an empty sequence a block. "
    "Return a whole number, an int: math.ceil of a division is one, but a count times 1.0 is a float.",
    "A partial block costs a whole block, so this is a division rounded up, in integers only: for positive integers, "
    "ceil(a / b) equals floor((a + b − 1) / b), and Python's integer division `//` floors.",
))
def _blocks_needed(fn: Any) -> None:
    for tokens, block_size in _BLOCK_CASES:
        got = call(fn, tokens, block_size)
        want = -(-tokens // block_size)
        if isinstance(got, bool) or not isinstance(got, int):
            raise Wrong(f"blocks_needed({tokens}, {block_size}) returned {got!r}: return a whole number of blocks "
                        "(an int, not a float)", hint=2)
        if got != want:
            if tokens == 0:
                why, k = "an empty sequence holds no block yet", 2
            elif tokens % block_size == 0 and got == want + 1:
                why, k = f"{tokens} tokens fill exactly {want} block(s) of {block_size}: the next block is taken " \
                         "only when a token no longer fits", 2
            elif got < want:
                why, k = f"{got} block(s) hold {got * block_size} tokens; the other {tokens - got * block_size} " \
                         "need one more, partly empty block: round up, not down", 1
            else:
                why, k = "a sequence needs ceil(tokens / block_size) blocks", 3
            raise Wrong(f"blocks_needed({tokens}, {block_size}) is {got}, expected {want}: {why}", hint=k)


def _grow_case(fn: Any, table: list[int], length: int, free: list[int], block_size: int) -> None:
    before_table, before_free = list(table), list(free)
    got = call(fn, list(table), length, free, block_size)
    opens = length % block_size == 0
    want = before_table + [before_free[0]] if opens else before_table
    want_free = before_free[1:] if opens else before_free
    where = f"a {length}-token sequence with table {before_table}, block_size {block_size}, free {before_free}"
    if not isinstance(got, list):
        raise Wrong(f"for {where}: return the block table as a list of block ids, got {type(got).__name__}")
    if got == want and free == want_free:
        return
    if opens and len(got) == len(before_table):
        slot = "it has no block yet" if length == 0 else f"its {len(before_table)} block(s) hold all {length} slots"
        raise Wrong(f"for {where}: {slot}, so the next token needs a new block; your table stayed {got}", hint=1)
    if not opens and len(got) > len(before_table):
        raise Wrong(f"for {where}: token {length + 1} goes to slot {length % block_size} of block "
                    f"{before_table[-1]}, which still has room; you took a new block ({got})", hint=1)
    if opens and got[:-1] == before_table and len(got) == len(want) and got[-1] != want[-1]:
        raise Wrong(f"for {where}: take the first free block ({before_free[0]}), not {got[-1]}: the pool hands "
                    "blocks out from the front of the free list", hint=2)
    if got == want and free != want_free:
        raise Wrong(f"for {where}: block {want[-1]} is now in the table but free is {free}: remove it from the "
                    "free list (free.pop(0)), or two sequences will write to the same block", hint=2)
    raise Wrong(f"for {where}: expected table {want} and free {want_free}, got table {got} and free {free}")


@exercise("07.grow_table", "one token into a block table", hints=(
    "The new token goes to slot length % block_size of the last block. A new block is needed only when that "
    "slot is 0: every slot of the last block is taken, or the sequence has no block yet. Test the length "
    "before the token is added, not length + 1.",
    "The new block is the first one in free, and it leaves the free list: take it out of that very list, in "
    "place, so no other sequence is handed the same block. free.pop() takes the last one; the pool hands "
    "blocks out from the front.",
    "A new block is needed exactly when the position being written, length, falls at the start of a block: test that "
    "with the remainder operator `%`. Then take the first block out of the free list (`pop` with an index) and append "
    "it to the table; return the table either way.",
))
def _grow_table(fn: Any) -> None:
    _grow_case(fn, [], 0, [7, 3, 5], 4)
    for length in (1, 2, 3):
        _grow_case(fn, [7], length, [3, 5], 4)
    _grow_case(fn, [7], 4, [3, 5], 4)
    _grow_case(fn, [7, 3], 5, [5], 4)
    _grow_case(fn, [2, 0], 32, [9, 4, 1], 16)
    _grow_case(fn, [2, 0, 9], 33, [4, 1], 16)
    _grow_case(fn, [6], 1, [1, 2], 1)
