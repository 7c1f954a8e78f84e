"""Many requests at once: the server, its batching, the load that measures it, and vLLM beside it.

``protocol``   the server's options and the OpenAI wire format: request validation, detokenising, stop text
``metrics``    Prometheus metrics written (the server's histograms and counters) and read (anyone's ``/metrics``)
``processes``  the one supervisor of long-running children: process group, log, ready-wait, group stop, ports
``decoder``    the batched greedy decode the server runs, on the decode core
``batchers``   the job queue: dynamic batching and continuous batching of jobs
``server``     the aiohttp server (OpenAI-compatible, streaming) that runs a batcher
``launch``     start a server in a thread or a process (under ``processes``), with a handle that stops it
``scheduler``  static against continuous batching of the same requests, measured
``continuous`` the continuous-batching engine: joining caches, a prefix cache
``batching``   the static batch-size sweep and the cost of padding
``paged``      PagedAttention's memory argument, simulated
``prefill``    prefix caching and chunked prefill, measured
``loadgen``    load against any OpenAI-compatible server (an async client, and Locust)
``locustfile`` the Locust users ``loadgen.run_locust`` runs against the server
``capacity``   the knee of an arrival-rate sweep (goodput under an SLO) and the replicas a load needs
``vllm``       vLLM itself, offline and as a server, beside transformers' ``generate``
``vllm_server`` ``vllm serve`` from vLLM's own environment (``make vllm``): checks, start, health, metrics, stop
``vllm_lab``   vLLM's engine on the lab's workload: one at a time and all at once, a squeezed pool, the replay
``vllm_bench`` ``vllm bench serve`` beside ``loadgen`` on the same server: one definition of each metric
``vllm_mechanisms`` prefix caching, chunked prefill and n-gram speculation in ``vllm serve``, beside the lab's
``router``     replicas of ``labkit serve`` (or ``vllm serve``) behind smg, a router from PyPI: start, ready, stop
``routing``    the shared-prefix multi-turn workload, what a routing policy did to each replica's cache, the rule

serve knows nothing about quantisers or compiled engines: a model arrives loaded, at whatever precision.
It never imports ``labkit.precision`` or ``labkit.engines``.
"""
