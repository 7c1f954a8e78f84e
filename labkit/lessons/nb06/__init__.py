"""Notebook 06: batching: static, padding, the server, arrivals. Its code, one module a job:

``checks``    its exercises' checks (registered with ``@exercise``; the learner's ids start with 06.)
``findings``  its takeaways: ``takeaways(...)`` from this run's results, the headline it records
``runs``      what the notebook executes: runs orchestrate mechanisms, never open a socket
"""
from . import checks, findings, runs

__all__ = ["checks", "findings", "runs"]
