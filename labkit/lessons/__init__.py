"""What the notebooks show: everything here is about teaching, nothing about running a model.

``exercises``  the self-checking exercises: ``use`` keeps the learner's function, each check names the mistake
``findings``   each notebook's takeaways (``findings.nbNN``) from its own results, and the headline it records
``plots``      Plotly figures that render offline
``widgets``    live panels for the notebooks (ipywidgets), each callback a plain function
``report``     the capstone's precision choice and its report
``beyond``     notebook 10's workloads and headline figures
``scale_out``  notebook 11's policy rounds, capacity sweep and headline figures
``features``   notebook 12's structured-output rounds against any OpenAI server, and its malformed requests
``pd``         notebook 12's prefill-here-decode-there session: three vLLM servers, the proxy, bytes and stalls
``cost``       $ per million tokens from a throughput and the sourced price table (``data/prices.json``)

lessons reads the packages below it and adds no mechanism of its own: a number a lesson prints was
measured by ``core`` … ``serve``.
"""
