"""What the notebooks show: everything here is about teaching, nothing about running a model.

nbNN/          one package per notebook (nb00 … nb14, nb03b), found by name as HF transformers keeps
               ``models/<name>/``: ``checks`` (its exercises), ``findings`` (its takeaways) and ``runs`` (what it and
               its bench script execute), for the notebooks that have them. A notebook imports its package
               (``from labkit.lessons import nb13``) and calls nb13.findings…, nb13.runs…. A new notebook's
               code is one new folder.
``exercises``  the framework of the self-checking exercises: ``@exercise``, ``use``, hints, ``progress``
``findings``   the framework of the takeaways: ``Findings``, ``record``, ``show``, the sentences several notebooks print
``plots``      Plotly figures that render offline
``widgets``    live panels for the notebooks (ipywidgets), each callback a plain function
``report``     the capstone's report: before/after, the highest concurrency meeting an SLO, HTML + JSON, class results
``references`` a reference's rows shown where a measurement cannot run here, under their provenance
``cost``       $ per million tokens from a throughput and the sourced price table (``data/prices.json``)

The runs' rule: a run orchestrates mechanisms (``serve``, ``serve.vllm``, ``serve.fleet``, ``decoding``) and never
opens a socket itself: every request goes through ``labkit.serve.client`` or ``labkit.serve.loadgen``; it measures
nothing the packages below do not measure.

lessons reads the packages below it and adds no mechanism of its own: a number a lesson prints was
measured by ``core`` … ``serve``.
"""
import re

NOTEBOOK = re.compile(r"nb\d\d[a-z]?")  # a notebook's package: nb00 … nb14, nb03b (the docstring and wall tests read it)
