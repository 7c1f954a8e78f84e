"""The project's own tools, run from the checkout as ``python -m tools.NAME`` (the Makefile's targets call them).

``cells``          a notebook's source in jupytext's percent format, read and written; cells found by their tag
``agenda``         how long each notebook takes in a room: the workshop agenda's arithmetic
``nbbuild``        notebooks/*.ipynb built from notebooks/src/*.py, and re-timed after a quick run
``summary``        what a run of notebooks produced: statuses, timings, results, build/summary.{json,html}
``run_notebooks``  every notebook executed headless, its exercises checked, references saved
``slides``         one offline reveal.js deck per executed notebook (a package: rules, tables, layout, prepare, build)
``answer_key``     the instructor's answer key: each headline figure's range by CPU class and mode
``merge_results``  a learner's results packed, the room's merged into one class page
``gpu_smoke``      a borrowed GPU machine's set-up, preflight and notebooks under deadlines
``tiny_model``     a tiny random model of each 2026 kind (sliding-window, hybrid, latent attention)
``llmc_compress``  llm-compressor's checkpoints, run in its own environment (``bench/llm_compressor.py``)
``under_load``     any command with other work on the cores, on purpose

tools stands on labkit and never the reverse; inside tools each module imports only those its layer allows
(``pyproject.toml``, the tools contract): the same walls as labkit's (480 lines, no import inside a function,
no edits of the import path).
"""
