# Typical wrong answers to notebook 07's exercises: each must be called "wrong", with a reason.

# %% exercise 07.blocks_needed
def blocks_needed(tokens: int, block_size: int) -> int:
    return tokens // block_size + 1  # one block too many whenever tokens is a multiple of block_size


# %% exercise 07.blocks_needed
def blocks_needed(tokens: int, block_size: int) -> int:
    return tokens // block_size  # rounds down: the last partial block is forgotten


# %% exercise 07.blocks_needed
def blocks_needed(tokens: int, block_size: int) -> float:
    import math

    return math.ceil(tokens / block_size) * 1.0  # right count, but a float


# %% exercise 07.grow_table
def grow_table(table: list[int], length: int, free: list[int], block_size: int) -> list[int]:
    if (length + 1) % block_size == 0:  # off by one: opens the block one token early
        table.append(free.pop(0))
    return table


# %% exercise 07.grow_table
def grow_table(table: list[int], length: int, free: list[int], block_size: int) -> list[int]:
    if length % block_size == 0:
        table.append(free[0])  # the block never leaves the pool
    return table


# %% exercise 07.grow_table
def grow_table(table: list[int], length: int, free: list[int], block_size: int) -> list[int]:
    if length % block_size == 0:
        table.append(free.pop())  # the last free block instead of the first
    return table
