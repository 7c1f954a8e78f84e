"""Notebook 04: warmup: cold start, compile pay-back. Its code, one module a job:

``checks``    its exercises' checks (registered with ``@exercise``; the learner's ids start with 04.)
``findings``  its takeaways: ``takeaways(...)`` from this run's results, the headline it records
"""
from . import checks, findings

__all__ = ["checks", "findings"]
