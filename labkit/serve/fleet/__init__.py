"""Many servers: replicas behind a router, the policy's effect on their caches, and how many a load needs.

``router``    replicas of ``labkit serve`` (or ``vllm serve``) behind smg, a router from PyPI: start, ready, stop
``routing``   the shared-prefix multi-turn workload, what a routing policy did to each replica's cache, the rule
``pd_proxy``  the lab's proxy in front of a prefill and a decode server, and the streams' stalls split or not
``capacity``  the knee of an arrival-rate sweep (goodput under an SLO) and the replicas a load needs
"""
