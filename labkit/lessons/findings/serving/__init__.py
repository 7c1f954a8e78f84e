"""Takeaways of the serving notebooks: many requests at once, on the lab's servers, vLLM and the clients around them.

``nb06``  batching: static, padding, the server, arrivals   ``nb11``  routing, capacity, cost, faults
``nb07``  paged KV, continuous batching, vLLM's engine      ``nb12``  structured outputs, LoRA adapters, P/D split
``nb09``  the capstone's before and after                   ``nb13``  agents: cached share, cache-busters, KV tiers
``nb10``  lookup, prefix cache, chunked prefill, KV, engines ``nb14``  trust: four clients, A/A, LoadGen, batch answers

Each module is one notebook's ``takeaways(...)``, as in ``labkit.lessons.findings`` above this room; the shared
pieces (``Findings``, ``record``, ``show``, the sentences several notebooks print) live there.
"""
