"""Notebook 02: fp16/bf16: speed beside quality. Its code, one module a job:

``checks``    its exercises' checks (registered with ``@exercise``; the learner's ids start with 02.)
``findings``  its takeaways: ``takeaways(...)`` from this run's results, the headline it records
"""
from . import checks, findings

__all__ = ["checks", "findings"]
