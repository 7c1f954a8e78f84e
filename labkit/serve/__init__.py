"""Many requests at once: the server, its batching, the load that measures it, and vLLM beside it.

``protocol``   the server's options and the OpenAI wire format: request validation, detokenising, stop text
``metrics``    Prometheus metrics written (the server's histograms and counters) and read (anyone's ``/metrics``)
``processes``  the one supervisor of long-running children: process group, log, ready-wait, group stop, ports
``decoder``    the batched greedy decode the server runs, on the decode core
``batchers``   the job queue: dynamic batching and continuous batching of jobs
``server``     the aiohttp server (OpenAI-compatible, streaming) that runs a batcher
``launch``     start a server in a thread or a process (under ``processes``), with a handle that stops it
``continuous`` the continuous-batching engine: requests joining and leaving a running batch's caches
``prefix_cache`` automatic prefix caching: prompt prefixes' KV reused, least recent to a disk tier
``client``     one request to any OpenAI-compatible server: its payload, its stream stamped chunk by chunk, bursts
``loadgen``    the load on any OpenAI-compatible server: arrivals, runs, SLOs, summaries, and Locust
``locustfile`` the Locust users ``loadgen.run_locust`` runs against the server

``experiments`` what the server does, measured and simulated: the batch-size sweep, static against continuous
               batching, PagedAttention's memory, prefix caching and chunked prefill
``vllm``       vLLM beside the lab: ``vllm serve`` started and measured, offline vLLM, its mechanisms, its bench
``agents``     agent sessions as requests (a seeded trace), and whether each turn extends the last (prefix lint)
``fleet``      replicas behind a router, routing policies and their caches, capacity against an SLO
``clients``    benchmark clients nobody here wrote (AIPerf, GuideLLM, vllm bench, MLPerf LoadGen) on one server, held
               to one definition; a proxy that injects a slowdown of known size

The lab's server is the flat spine; the rooms stand on it. Inside serve the order is an import-linter
contract (``pyproject.toml``): ``fleet``, ``agents`` and ``clients`` above ``vllm`` above ``experiments`` above
``launch``, ``server``, ``batchers`` and the pieces below them.

serve knows nothing about quantisers or compiled engines: a model arrives loaded, at whatever precision.
It never imports ``labkit.precision`` or ``labkit.engines``.
"""
