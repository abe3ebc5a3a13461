"""Lazy package exports: a stage's ``__init__`` names its main objects without importing them.

``ccld verdicts`` must not import Faust, and ``import ccld.sinks`` must not import Arrow, so a
package lists ``name -> module`` and the module is imported on first attribute access.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, where: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package``, whose names live in the modules of ``where``."""

    def getattr_(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return sorted(where), getattr_
