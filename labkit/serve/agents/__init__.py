"""Serving agents: sessions that send their whole history every turn, and what keeps their prefix cached.

``trace``        an agent trace made here (seeded): sessions of chat requests with tool schemas, tool calls and tool
                 results, each turn extending the last, and the cache-busters deployments hit
``prefix_lint``  does the later request of a session extend the earlier one, and if not, where and why (also
                 ``python -m labkit prefix-lint OLD.json NEW.json``)
``tiers``        reloading a session's KV against recomputing it (the crossover length), sessions a KV budget holds
``toolcalls``    where a tool call lands in a completion (``tool_calls``, the text, nowhere), whether it conforms, the
                 table per ``tool_choice``

A room of serve, beside ``fleet`` and ``vllm``: it stands on the lab's server and its client, never the reverse.
"""
