"""Notebook 03b: FP8/FP4: formats, quality, FP8 GEMMs. Its code, one module a job:

``checks``    its exercises' checks (registered with ``@exercise``; the learner's ids start with 03.)
``findings``  its takeaways: ``takeaways(...)`` from this run's results, the headline it records
"""
from . import checks, findings

__all__ = ["checks", "findings"]
