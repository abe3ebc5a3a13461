"""Attach CCL-D to PyTorch jobs (torch.distributed): ``attach()``, ``detach()``, ``ccld run``.

Imports are lazy so ``import ccld.producers.attach`` never imports torch or numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ccld.producers.attach.session import Attachment, attach, current, detach

__all__ = ["Attachment", "attach", "current", "detach"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ccld.producers.attach import session

        return getattr(session, name)
    raise AttributeError(name)
