"""What the notebooks show: everything here is about teaching, nothing about running a model.

``exercises``  the self-checking exercises: ``use`` keeps the learner's function, each check names the mistake
``findings``   each notebook's takeaways (``findings.nbNN``) from its own results, and the headline it records
``plots``      Plotly figures that render offline
``widgets``    live panels for the notebooks (ipywidgets), each callback a plain function
``runs``       each notebook's runs (``runs.nbNN``), and its bench script's: they orchestrate, never open a socket
``report``     the capstone's report: before/after, the highest concurrency meeting an SLO, HTML + JSON, class results
``references`` a reference's rows shown where a measurement cannot run here, under their provenance
``cost``       $ per million tokens from a throughput and the sourced price table (``data/prices.json``)

lessons reads the packages below it and adds no mechanism of its own: a number a lesson prints was
measured by ``core`` … ``serve``.
"""
