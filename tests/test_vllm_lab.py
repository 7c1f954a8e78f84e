"""vLLM's engine held to the lab's mechanisms, without vLLM: the squeezed pool's command line, the replay of a
workload through vLLM's pool, a server that dies mid-run, and vllm bench serve's command and results."""
from __future__ import annotations

from pathlib import Path

import pytest

from labkit.serve import vllm_server as vs


def test_a_pool_of_exactly_n_blocks_is_asked_for_on_the_command_line():
    s = vs.Settings(model="/m", block_size=32, num_blocks=9, max_model_len=256)
    argv = vs.command(s, 8123, python=Path("/env/bin/python"))
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "9" and argv[argv.index("--block-size") + 1] == "32"
    assert "--num-gpu-blocks-override" not in vs.command(vs.Settings(model="/m"), 1, python=Path("py"))
    with pytest.raises(ValueError, match="num_blocks=0: a positive integer"):
        vs.Settings(model="/m", num_blocks=0)
