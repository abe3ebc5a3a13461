"""What librdkafka tells a client about itself, made readable: one log line per condition, a broker-gone clock.

librdkafka retries a refused connection every 50-100 ms and logs each attempt (``%3|...|FAIL|...``
on stderr by default: about 190 lines in the 10 s a dead bootstrap address takes to fail).
``KafkaLog`` is the ``logger`` confluent-kafka accepts in a client's config: it turns those into
one Python log line per condition, and a count of repeats at most once a minute. ``BrokerWatch``
reads the client's statistics (``stats_cb``) to tell how long no broker connection has been up,
so a tail can give up on a broker that is gone instead of retrying forever in silence.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ccld.kafka")

#: A condition logged once is logged again (with its repeat count) at most this often (seconds).
REPEAT_S = 60.0
#: Conditions remembered at most; librdkafka's texts carry addresses, so their number is small but unbounded.
CONDITIONS_MAX = 256

# Parts of a librdkafka message that change from one repeat to the next without changing what it says.
_THREAD = re.compile(r"^\[thrd:[^\]]*\]:\s*")
_AFTER = re.compile(r"\s*\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)")
_SUPPRESSED = re.compile(r",?\s*\d+ identical error\(s\) suppressed")


def condition(text: str) -> str:
    """The part of a librdkafka message that names the condition (the thread, timings and repeat counts removed)."""
    return _SUPPRESSED.sub("", _AFTER.sub("", _THREAD.sub("", text.strip()))).strip()


def reason(text: str) -> str:
    """The short cause in a condition: ``Connection refused`` of ``... Connect to ... failed: Connection refused``."""
    return text.rsplit("failed: ", 1)[-1].strip() if "failed: " in text else text


class KafkaLog:
    """A ``logger`` for a confluent-kafka client: one line per librdkafka condition, repeats counted.

    confluent-kafka calls ``log(level, "%s [%s] %s", facility, client_name, message)`` from the
    thread that polls the client; ``error`` is meant for the client's ``error_cb``. While ``muted``
    (before the first successful contact, when the caller reports a failure itself in one line)
    conditions are only remembered: ``last`` holds the newest.
    """

    def __init__(self, logger: logging.Logger | None = None, *, muted: bool = False,
                 clock: Callable[[], float] = time.monotonic, repeat_s: float = REPEAT_S) -> None:
        self.logger = logger or log
        self.muted = muted
        self.clock = clock
        self.repeat_s = repeat_s
        self.last: str = ""  # the newest condition, for the caller's own error message
        self.errors = 0  # conditions at ERROR level or above, repeats included
        self._seen: dict[str, list[float]] = {}  # condition -> [last emitted at, repeats since]
        self._lock = threading.Lock()  # error_cb and logs may come from different polling threads

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """What confluent-kafka calls for each librdkafka log line."""
        if len(args) == 3:  # (facility, client name, message): the facility and client add nothing readable
            text = str(args[2])
        else:
            text = fmt % args if args else fmt
        # librdkafka's info and notice lines are routine (an idle connection closed, a rebalance): debug here
        self._note(level if level >= logging.WARNING else logging.DEBUG, condition(text))

    def error(self, err: Any) -> None:
        """An ``error_cb``: the same condition as the log line it usually repeats, so counted with it."""
        level = logging.ERROR if getattr(err, "fatal", lambda: False)() else logging.WARNING
        self._note(level, condition(str(err.str() if hasattr(err, "str") else err)))

    def _note(self, level: int, text: str) -> None:
        now = self.clock()
        with self._lock:
            self.last = text
            if level >= logging.ERROR:
                self.errors += 1
            seen = self._seen.get(text)
            if seen is None:
                if len(self._seen) >= CONDITIONS_MAX:
                    self._seen.pop(next(iter(self._seen)))  # the oldest condition: forgetting it costs one line
                self._seen[text] = [now, 0]
                line = text
            elif now - seen[0] >= self.repeat_s:
                line = f"{text} (again; {seen[1] + 1} times in the last {now - seen[0]:.0f} s)"
                seen[0], seen[1] = now, 0
            else:
                seen[1] += 1
                return
        if not self.muted:
            self.logger.log(level, "kafka: %s", line)


class BrokerWatch:
    """How long a client has had no broker connection up, from its statistics and the messages it got.

    Feed it the client's ``stats_cb`` JSON (``statistics.interval.ms``) and call ``alive`` for every
    message received; ``down_for`` is 0 while the last statistics showed a connection up.
    """

    def __init__(self, now: float) -> None:
        self.last_up = now
        self.up = True  # the caller builds it once a first contact succeeded

    def stats(self, raw: str, now: float) -> None:
        try:
            brokers = json.loads(raw).get("brokers") or {}
        except (ValueError, AttributeError):
            return  # a statistics blob we cannot read says nothing either way
        self.up = any(isinstance(b, dict) and b.get("state") == "UP" for b in brokers.values())
        if self.up:
            self.last_up = now

    def alive(self, now: float) -> None:
        self.up = True
        self.last_up = now

    def down_for(self, now: float) -> float:
        return 0.0 if self.up else max(now - self.last_up, 0.0)


def unreachable(bootstrap: str, detail: str) -> str:
    """The one line a command prints when no broker answers: the address, the cause and what to check."""
    cause = f" ({detail})" if detail else ""
    return (f"cannot reach Kafka at {bootstrap}{cause}: check that a broker runs there (`ccld up` and "
            "`ccld broker` print their bootstrap), that --bootstrap or CCLD_BOOTSTRAP names its advertised "
            "listener, and for TLS or SASL the CCLD_SECURITY_PROTOCOL, CCLD_SSL_* and CCLD_SASL_* settings")
