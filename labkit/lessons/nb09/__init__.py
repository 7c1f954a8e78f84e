"""Notebook 09: the capstone's before and after. Its code, one module a job:

``findings``  its takeaways: ``takeaways(...)`` from this run's results, the headline it records
``runs``      what the notebook executes: runs orchestrate mechanisms, never open a socket
"""
from . import findings, runs

__all__ = ["findings", "runs"]
