"""Signal handling shared by the long-running stack commands (`ccld up`, `ccld broker`, `ccld demo`)."""

from __future__ import annotations

import signal


def stop_on_sigterm() -> None:
    """Make SIGTERM (and SIGINT, even where a shell started us with it ignored) unwind like Ctrl-C,
    so ``with``/``finally`` blocks stop brokers and children."""

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
