"""The decks: one reveal.js deck per executed notebook, offline (``python -m tools.slides``, ``make slides``).

``rules``    what a deck shows (the deck rules), the slide's geometry and sizes, how a cell's tags are read
``tables``   a table read into a grid, tidied, cut to the slide, its height at a browser's column widths
``layout``   each cell's estimated height, code cut before statements, ``paginate`` into slides that fit
``prepare``  a notebook made fit for a deck: outputs not set-up, prose as text, notes keep what a slide cuts
``build``    the export (nbconvert's slides exporter, the local template and assets), the index, the command

Each module imports only those above it in this list (``tools``' import-linter contract).
"""
