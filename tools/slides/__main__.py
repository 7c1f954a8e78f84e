"""``python -m tools.slides``: build the decks (``tools.slides.build.main``)."""
from __future__ import annotations

import sys

from tools.slides.build import main

sys.exit(main())
