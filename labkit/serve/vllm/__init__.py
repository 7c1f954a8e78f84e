"""vLLM beside the lab's mechanisms: the real engine, started from its own environment and measured the lab's way.

``server``      ``vllm serve`` from vLLM's own environment (``make vllm``): checks, start, health, metrics, stop
``offline``     vLLM itself, offline and as a server, beside transformers' ``generate``
``lab``         vLLM's engine on the lab's workload: one at a time and all at once, a squeezed pool, the replay
``bench``       ``vllm bench serve`` beside ``loadgen`` on the same server: one definition of each metric
``mechanisms``  prefix caching, chunked prefill and n-gram speculation in ``vllm serve``, beside the lab's
``lora``        multi-LoRA in ``vllm serve``: the flags, answers against merged weights, base/one/mixed throughput
``shared``      the room's one ``vllm serve`` (``LABKIT_SERVER_URL``): checked, asked its model, labelled as elsewhere
``disagg``      prefill on one ``vllm serve``, decode on another: the KV connector, its files, bytes moved (the proxy: fleet)

Nothing here imports vLLM into the lab's process except ``offline`` on a GPU machine whose environment has it:
``vllm serve`` runs as a child (``labkit.serve.processes``) and is read through its HTTP API and ``/metrics``.
"""
