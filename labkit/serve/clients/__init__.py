"""Benchmark clients nobody here wrote, on one server, held to one definition (notebook 14).

``align``    every client's per-request stamps under one definition (TTFT, TPOT without the first token, output
             tokens per second over the run's span) and how far the clients stay apart after it
``outside``  NVIDIA AIPerf and GuideLLM (``make clients``: ``.venv-clients``), run on the lab's request set, their
             exports read back into the lab's per-request records, with each one's own figures and definitions
``mlperf``   MLPerf LoadGen's system-under-test callbacks over an OpenAI-compatible server
``delay``    a streaming proxy that adds a known delay per token: an injected slowdown of known size
``readers``  A/A and A/B trials of interleaved passes through two such proxies, read four ways (one run each, the
             overlap rule, a request bootstrap, the paired test): each reader's false positives and detections
"""
