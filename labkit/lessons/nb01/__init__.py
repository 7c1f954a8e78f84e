"""Notebook 01: sizing, bandwidth, roofline, the decode gap. Its code, one module a job:

``checks``    its exercises' checks (registered with ``@exercise``; the learner's ids start with 01.)
``findings``  its takeaways: ``takeaways(...)`` from this run's results, the headline it records
"""
from . import checks, findings

__all__ = ["checks", "findings"]
