"""labkit.serve.experiments.paged: block arithmetic, the allocator, footprints and the step-by-step replay on
hand-checked cases."""
from __future__ import annotations

import pytest

from labkit.serve.experiments import paged


def req(i: int, prompt: int, answer: int, max_tokens: int) -> paged.Request:
    return paged.Request(id=f"r{i}", prompt_tokens=prompt, answer_tokens=answer, max_tokens=max_tokens)


def test_blocks_for():
    assert [paged.blocks_for(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match="block_size"):
        paged.blocks_for(3, 0)
    with pytest.raises(ValueError, match="tokens"):
        paged.blocks_for(-1)


def test_reserved_tokens_per_policy():
    r = req(0, prompt=10, answer=7, max_tokens=20)  # 17 tokens at the end
    assert paged.reserved_tokens(r, "contiguous-max", 64) == 64
    assert paged.reserved_tokens(r, "contiguous-reserve", 64) == 30
    assert paged.reserved_tokens(r, "paged", 64, block_size=16) == 32  # two blocks, 15 slots empty
    assert paged.reserved_tokens(r, "paged", 64, block_size=16, length=10) == 16  # only the prompt so far
    with pytest.raises(ValueError, match="choose one of"):
        paged.reserved_tokens(r, "buddy", 64)
    with pytest.raises(ValueError, match="max_model_len"):
        paged.reserved_tokens(r, "paged", 16)  # 10 + 20 does not fit a 16-token model


def test_footprint_waste():
    rs = [req(0, 10, 7, 20), req(1, 16, 16, 16)]  # 17 and 32 tokens used
    f = paged.footprint(rs, "paged", kv_bytes_per_token=100, max_model_len=64, block_size=16)
    assert f["used_tokens"] == 49 and f["reserved_tokens"] == 64  # 2 blocks + 2 blocks
    assert f["used_bytes"] == 4900 and f["wasted_bytes"] == 1500
    assert f["waste_fraction"] == pytest.approx(15 / 64)
    c = paged.footprint(rs, "contiguous-max", 100, 64)
    assert c["reserved_tokens"] == 128 and c["waste_fraction"] == pytest.approx(1 - 49 / 128)
    assert paged.mean_blocks_wasted(rs, 16) == pytest.approx((15 + 0) / 2)


def test_fit_count_round_robin():
    rs = [req(i, 10, 7, 20) for i in range(3)]  # each: paged 32, reserve 30, max 64 tokens
    kv = 10  # bytes per token
    assert paged.fit_count(rs, "paged", 100 * kv, kv, 64) == 3  # 96 of 100 tokens
    assert paged.fit_count(rs, "contiguous-reserve", 100 * kv, kv, 64) == 3  # 90
    assert paged.fit_count(rs, "contiguous-max", 100 * kv, kv, 64) == 1
    assert paged.fit_count(rs, "paged", 200 * kv, kv, 64) == 6  # requests reused round-robin
    assert paged.fit_count(rs, "contiguous-max", 200 * kv, kv, 64) == 3


def test_block_allocator():
    pool = paged.BlockAllocator(num_blocks=4, block_size=16)
    assert pool.allocate("a", 17) and pool.table("a") == [0, 1] and pool.free_blocks == 2
    for _ in range(15):  # 17 → 32 tokens: still two blocks
        assert pool.append("a")
    assert pool.free_blocks == 2 and pool.used_tokens == 32 and pool.reserved_tokens == 32
    assert pool.append("a") and pool.table("a") == [0, 1, 2]  # token 33 opens a third block
    assert not pool.allocate("b", 17)  # needs 2 blocks, 1 free: nothing taken
    assert pool.free_blocks == 1
    assert pool.allocate("b", 3) and pool.free_blocks == 0
    assert pool.append("b")  # 4 tokens in a 16-token block
    pool.free("a")
    assert pool.free_blocks == 3 and pool.used_tokens == 4
    with pytest.raises(ValueError, match="allocate it first"):
        pool.append("a")
    with pytest.raises(ValueError, match="already holds"):
        pool.allocate("b", 1)


def test_grow_table_takes_a_block_only_when_the_last_is_full():
    free = [7, 3, 5]
    table = paged.grow_table([], 0, free, block_size=4)  # the first token opens the first block
    assert table == [7] and free == [3, 5]
    for length in (1, 2, 3):  # tokens 2..4 fill it
        assert paged.grow_table(table, length, free, 4) == [7] and free == [3, 5]
    assert paged.grow_table(table, 4, free, 4) == [7, 3] and free == [5]  # token 5: a second block, the first free one
    from collections import deque

    dq = deque([9])
    assert paged.grow_table([1], 16, dq, 16) == [1, 9] and not dq
    with pytest.raises(ValueError, match="no free block"):
        paged.grow_table([1], 16, [], 16)
    with pytest.raises(ValueError, match="holds 2 blocks"):
        paged.grow_table([1], 5, [2], 4)  # a 5-token sequence cannot have one 4-token block
    with pytest.raises(ValueError, match="length"):
        paged.grow_table([], -1, [2], 4)


def test_replay_tables_step_by_step():
    a, b = req(0, prompt=5, answer=4, max_tokens=8), req(1, prompt=2, answer=2, max_tokens=8)
    rows = paged.replay_tables([a, b], num_blocks=6, block_size=4)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[0] == {"step": 0, "r0": [0, 1], "r1": [2], "free_blocks": 3}  # prompts: 5 tokens → 2 blocks, 2 → 1
    assert rows[2]["r1"] == [2] and rows[2]["r0"] == [0, 1]  # r1 at 4 tokens, r0 at 7: no new block yet
    assert rows[4] == {"step": 4, "r0": [0, 1, 3], "r1": [2], "free_blocks": 2}  # r0's 9th token opens block 3
    with pytest.raises(ValueError, match="ran out of blocks"):
        paged.replay_tables([a, b], num_blocks=3, block_size=4)
    with pytest.raises(ValueError, match="cannot hold the prompts"):
        paged.replay_tables([a, b], num_blocks=2, block_size=4)


def test_simulate_contiguous_runs_one_at_a_time():
    rs = [req(0, 1, 2, 2), req(1, 1, 2, 2)]
    sim = paged.simulate(rs, "contiguous-max", budget_tokens=4, max_model_len=4)
    assert sim.steps == 4 and sim.max_running == 1 and sim.mean_running == 1 and sim.preemptions == 0
    sim = paged.simulate(rs, "contiguous-reserve", budget_tokens=4, max_model_len=4)  # 3 tokens each
    assert sim.steps == 4 and sim.max_running == 1


def test_simulate_paged_shares_the_pool_and_preempts():
    rs = [req(0, 1, 2, 2), req(1, 1, 2, 2)]
    # block size 1, 3 blocks: both prefilled (1 block each) and each chooses a token; at step 2 r0 stores its
    # token (the third block) and r1 finds none, so r1 (the newest) is preempted and r0 finishes; step 3
    # recomputes r1's prompt and token (2 blocks) and it finishes. The last token's KV is never stored.
    sim = paged.simulate(rs, "paged", budget_tokens=3, max_model_len=4, block_size=1)
    assert sim.steps == 3 and sim.preemptions == 1 and sim.max_running == 2
    fits = paged.simulate(rs, "paged", budget_tokens=4, max_model_len=4, block_size=1)
    assert fits.preemptions == 0 and fits.steps == 2, "prompt + answer − 1 tokens each: 4 blocks hold both"
    big = paged.simulate(rs, "paged", budget_tokens=8, max_model_len=4, block_size=1)
    assert big.steps == 2 and big.preemptions == 0 and big.mean_waste_fraction == 0
    capped = paged.simulate(rs, "paged", budget_tokens=8, max_model_len=4, block_size=1, max_running=1)
    assert capped.steps == 4
    with pytest.raises(ValueError, match="cannot hold even one"):
        paged.simulate(rs, "contiguous-max", budget_tokens=3, max_model_len=4)


def test_compare_and_the_requests_file():
    rs = paged.load_requests()
    assert len(rs) >= 40 and len({r.id for r in rs}) == len(rs)
    assert all(r.answer_tokens <= r.max_tokens for r in rs)
    stats = paged.length_stats(rs)
    assert stats["answer_min"] < stats["answer_mean"] < stats["answer_max"]
    rows = {r["policy"]: r for r in paged.compare(rs, kv_bytes_per_token=1000, budget_bytes=20_000_000,
                                                   max_model_len=2048)}
    assert set(rows) == set(paged.POLICIES)
    # paged wastes less than one block per request; contiguous reservations waste far more
    assert rows["paged"]["wasted_bytes"] < len(rs) * 16 * 1000
    assert rows["paged"]["waste_fraction"] < rows["contiguous-reserve"]["waste_fraction"] < rows["contiguous-max"]["waste_fraction"]
    assert rows["paged"]["fit_in_budget"] > rows["contiguous-reserve"]["fit_in_budget"] > rows["contiguous-max"]["fit_in_budget"]
    assert rows["paged"]["sim_steps"] <= rows["contiguous-max"]["sim_steps"]


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="exceeds max_tokens"):
        req(0, 5, 10, 8)
    with pytest.raises(ValueError, match="prompt_tokens"):
        req(0, 0, 1, 8)
    with pytest.raises(ValueError, match="no requests"):
        paged.footprint([], "paged", 1, 8)
    with pytest.raises(ValueError, match="no requests file"):
        paged.load_requests("/nonexistent/requests.json")
