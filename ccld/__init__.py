"""CCL-D: detect and localize slow and hung collective communication in model training.

``ccld.attach()`` / ``ccld.detach()`` observe torch.distributed in this process (the
PyTorch attachment); they import torch only when called.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "attach", "detach"]


def attach(*args: Any, **kwargs: Any) -> Any:
    """Start observing torch.distributed in this process; see ``ccld.producers.attach.attach``."""
    from ccld.producers.attach import attach as _attach

    return _attach(*args, **kwargs)


def detach(*args: Any, **kwargs: Any) -> Any:
    """Stop observing, restore torch.distributed, flush; see ``ccld.producers.attach.detach``."""
    from ccld.producers.attach import detach as _detach

    return _detach(*args, **kwargs)
