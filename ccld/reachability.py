"""Whether any bootstrap broker accepts connections now: a cheap check before waiting on a broker that is gone.

A clean stop of the worker or the sink commits offsets and flushes output, and each of those
waits on the broker for seconds (librdkafka's commit about 7 s, Faust's stop up to its grace).
With nothing listening there is nothing to wait for; a refused connection answers at once.
"""

from __future__ import annotations

import socket


def broker_reachable(bootstrap: str, timeout_s: float = 0.5) -> bool:
    """True when a TCP connection to one of ``bootstrap``'s ``host:port`` entries opens within ``timeout_s``.

    Only the connection: a frozen broker (SIGSTOP) still counts as reachable, as it should, since it
    may come back and take the commit.
    """
    for entry in bootstrap.split(","):
        address = entry.strip().rpartition("://")[2]  # "SSL://host:9093" and plain "host:9093"
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s).close()
            return True
        except (OSError, ValueError):
            continue
    return False
