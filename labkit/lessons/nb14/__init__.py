"""Notebook 14: trust: four clients, A/A, LoadGen, batch answers. Its code, one module a job:

``checks``    its exercises' checks (registered with ``@exercise``; the learner's ids start with 14.)
``findings``  its takeaways: ``takeaways(...)`` from this run's results, the headline it records
``runs``      what the notebook executes (and ``bench/trust.py``): runs orchestrate mechanisms, never open a socket
"""
from . import checks, findings, runs

__all__ = ["checks", "findings", "runs"]
