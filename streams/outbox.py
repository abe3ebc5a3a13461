"""Verdicts between being found and being acknowledged by the broker, and those already sent.

Shared by both kinds of partition processor (``processor.PartitionProcessor`` on the metrics
topic, ``stage.StageProcessor`` on the reports topic): a verdict found twice (a message delivered
twice, a restart from a snapshot) is handed out once, and one never acknowledged is handed out
again, after a restart too (``pending`` is in every snapshot).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from ccld.records import Verdict
from ccld.schemas.codec import encode_verdict

log = logging.getLogger(__name__)

#: Remember this many sent (incident, state) pairs per partition for de-duplication, at most; a job's are
#: forgotten with the job (``forget_job``), so a partition remembers its live jobs' verdicts, not a day's.
SENT_MEMORY = 50_000
#: Counter keys of the verdicts sent by class and state: ``verdicts:<kind>:<state>`` (``verdict_counter``).
VERDICT_COUNTER_PREFIX = "verdicts:"


def verdict_counter(kind: str, state: str) -> str:
    """The counter key of the verdicts of ``kind`` (H1 ...) in ``state`` (open ...) acknowledged by the broker."""
    return f"{VERDICT_COUNTER_PREFIX}{kind}:{state}"


class Outbox:
    """Pending and sent verdicts of one partition; subclasses provide ``counters``."""

    counters: dict[str, int]

    def _init_outbox(self, state: Mapping[str, Any] | None) -> None:
        self._sent: OrderedDict[str, str] = OrderedDict()  # dedupe key -> its job
        # Verdicts handed out but not yet acknowledged by the broker, in the order they were found.
        self._pending: OrderedDict[str, tuple[Verdict, bytes]] = OrderedDict()
        # Restored with pending verdicts: some may have reached the topic just before the worker died
        # (acknowledged, not yet snapshotted as sent); the sender checks the topic before sending them.
        self.restored_pending = False
        if state:
            # [key, job] pairs; a bare key is from a snapshot before jobs were kept with them (job unknown: "")
            self._sent.update((str(k), "") if isinstance(k, str) else (str(k[0]), str(k[1]))
                              for k in state.get("sent", ()))
            for d in state.get("pending", ()):
                v = Verdict.from_dict(d)
                self._pending[v.dedupe_key] = (v, encode_verdict(v))
            self.restored_pending = bool(self._pending)

    def outbox_state(self) -> dict[str, Any]:
        return {"sent": [[k, job] for k, job in self._sent.items()],
                "pending": [v.to_dict() for v, _ in self._pending.values()]}

    def forget_job(self, job: str) -> None:
        """The job is forgotten (silent past its expiry, nothing open): so are the verdicts it was sent."""
        for key in [k for k, j in self._sent.items() if j == job]:
            del self._sent[key]

    def found(self, verdicts: Iterable[Verdict]) -> None:
        """Hand out new verdicts (pending until acknowledged); repeats are counted and dropped."""
        for v in verdicts:
            key = v.dedupe_key
            if key in self._sent or key in self._pending:
                self.counters["duplicate_verdicts"] += 1
                continue
            self._pending[key] = (v, encode_verdict(v))
            log.info("verdict found, pending until the broker acknowledges it: %s", v.describe())

    def pending(self) -> list[tuple[Verdict, bytes]]:
        """Verdicts found but not yet acknowledged by the broker, oldest first."""
        return list(self._pending.values())

    def pending_of(self, job: str) -> bool:
        """Whether a verdict of ``job`` waits for the broker's acknowledgement."""
        return any(v.job == job for v, _ in self._pending.values())

    def mark_sent(self, verdict: Verdict) -> None:
        """The broker acknowledged the verdict: never hand it out again (until SENT_MEMORY forgets it)."""
        key = verdict.dedupe_key
        if self._pending.pop(key, None) is None and key in self._sent:
            return
        self._sent[key] = verdict.job
        if len(self._sent) > SENT_MEMORY:
            self._sent.popitem(last=False)
        self.counters["verdicts"] += 1
        # by class and state too (``ccld_worker_verdicts_total{kind,state}``); in the counters, so restarts keep it
        by = verdict_counter(verdict.kind.value, verdict.state.value)
        self.counters[by] = self.counters.get(by, 0) + 1
