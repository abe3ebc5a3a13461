"""Makes the archive tests' helpers (test_archive_layout.py) importable by the other tests here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
