"""labkit.serve.launch: a server on port 0 reports its port and binds loopback, bad options name the fix (in
start_server and in one line from ``python -m labkit serve``), and a subprocess server starts and stops cleanly."""
from __future__ import annotations

import subprocess
import sys

import pytest
from test_server import assert_still_serving

from labkit.serve import launch, protocol


def test_port_zero_reports_the_bound_port_and_binds_loopback(server):
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert server.running


def test_bad_server_options_name_the_fix():
    with pytest.raises(ValueError, match="max_batch_size"):
        launch.start_server(protocol.TINY_RANDOM, max_batch_size=0)
    with pytest.raises(ValueError, match="choose from"):
        launch.start_server(protocol.TINY_RANDOM, batch=4)


def test_subprocess_server_starts_and_stops_cleanly():
    with launch.run_server(protocol.TINY_RANDOM, subprocess=True, port=0, max_batch_size=4) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        assert_still_serving(srv.url)
    assert srv.proc.returncode == 0, "\n".join(srv.output)
    assert any("stopped" in line for line in srv.output)


def test_cli_refuses_bad_options_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "labkit", "serve", "--max-batch-size", "0"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "max_batch_size" in proc.stderr and "Traceback" not in proc.stderr
