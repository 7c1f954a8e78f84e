"""The runs a notebook executes, one module per notebook (``nbNN``); where the notebook has a bench script (10:
``bench/beyond.py``, 11: ``bench/scale_out.py``, 12: ``bench/serving_features.py``, 13: ``bench/agents.py``, 14: ``bench/trust.py``) it runs the same code, so the
numbers a notebook prints and the ones ``make bench`` records agree.

``nb06``  the lab's servers and ``vllm serve`` under the same load, interleaved rounds
``nb09``  the capstone: a precision chosen by speed and answers, load points, the SLO sweep, vLLM under that load
``nb10``  the workloads beyond one prompt (a copied text, a shared document, a long prompt among streams)
``nb11``  the routing policies' rounds, the capacity sweep, the headline figures
``nb12``  structured outputs against any server, malformed requests, and the prefill/decode split session
``nb13``  an agent trace replayed turn by turn, the disk tier's reload against recompute, tool calls per tool_choice
``nb14``  four clients on one server, A/A and A/B trials, open and closed loop, vLLM's answers alone and in batches

The rule: a run orchestrates mechanisms (``serve``, ``serve.vllm``, ``serve.fleet``, ``decoding``) and never
opens a socket itself: every request goes through ``labkit.serve.client`` or ``labkit.serve.loadgen``. Takeaways
are ``lessons.findings``'; tables shown from a reference are ``lessons.references``'.
"""
