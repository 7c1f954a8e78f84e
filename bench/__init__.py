"""The benchmark scripts, each run from the checkout as ``python -m bench.NAME`` (``make bench`` runs every one).

Each prints one JSON line per measurement and a JSON document last; docs/setup.md's table says what each measures and
what it expects. They import labkit as any user does: from the checkout (``python -m`` puts it first on the path) or
installed (``pip install -e .``); nothing edits the import path.
"""
