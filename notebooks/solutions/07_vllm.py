# Solutions to notebook 07's exercises: each cell replaces the exercise cell with the same marker.

# %% exercise 07.blocks_needed
def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` slots that a sequence of ``tokens`` tokens occupies."""
    return -(-tokens // block_size)  # ceil(tokens / block_size) in integers: the last block may be partly empty


# %% exercise 07.grow_table
def grow_table(table: list[int], length: int, free: list[int], block_size: int) -> list[int]:
    """The block table of a ``length``-token sequence after it gains one token."""
    if length % block_size == 0:  # every slot of the last block is taken (or there is no block yet)
        table.append(free.pop(0))  # the first free block leaves the pool and joins this sequence
    return table
