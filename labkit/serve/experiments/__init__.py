"""The serving experiments: what the lab's server does, measured and simulated beside it, one question each.

``batching``   the static batch-size sweep and the cost of padding
``scheduler``  static against continuous batching of the same requests, measured
``paged``      PagedAttention's memory argument, simulated: three allocation policies, the block table, the pool
``prefill``    prefix caching and chunked prefill, measured from the client side

They stand on the spine (``labkit.serve``'s server, its batchers, the continuous engine and its prefix cache, the
load) and never the reverse: nothing in the spine imports an experiment. The rooms above (``vllm``, ``fleet``)
set them beside vLLM's own mechanisms.
"""
