"""Notebook 11: routing, capacity, cost, faults. Its code, one module a job:

``checks``    its exercises' checks (registered with ``@exercise``; the learner's ids start with 11.)
``findings``  its takeaways: ``takeaways(...)`` from this run's results, the headline it records
``runs``      what the notebook executes (and ``bench/scale_out.py``): runs orchestrate mechanisms, never open a socket
"""
from . import checks, findings, runs

__all__ = ["checks", "findings", "runs"]
