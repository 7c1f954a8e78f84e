"""Notebook 00: the first chat on this machine. Its code, one module a job:

``findings``  its takeaways: ``takeaways(...)`` from this run's results, the headline it records
"""
from . import findings

__all__ = ["findings"]
