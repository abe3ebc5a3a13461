"""When a message goes to the on-disk spool, and the state machine that replays the spool to the broker.

``MetricsProducer`` (``ccld.producers.kafka``) owns one ``SpoolReplay`` and calls it; the spool's files
are ``ccld.producers.spool`` (pure file I/O). Without ``spool_dir`` (or when the spool cannot be
opened) nothing here acts: every message the broker does not take is counted lost by the producer.
What this module counts goes into the producer's counters (``stats``): ``recovered_records`` (left in
the slot by an earlier process), ``spooled_in_records``, ``spool_lost_records`` (spool full, or too old
when its turn came), ``replayed_records`` (counted ``delivered_records`` too),
``replay_duplicate_records`` (delivered again because their group was retried) and
``replay_rejected_records`` (refused for good).

States (implicit in three fields: ``_outage``, the spool's ``pending_messages`` and ``_group``):

- DIRECT: no outage and nothing on disk. New batches go straight to librdkafka.
- SPOOLING: an outage began, or messages wait on disk, or no broker has told the partition count
  yet (``spooling``). New batches go to the spool behind the older ones, so the order holds.
- REPLAYING: one group of spooled messages, read from the spool's head, is in librdkafka's hands.
  New batches still go to the spool; no other group starts until this one ends.

Transitions:

- DIRECT -> SPOOLING: a delivery report with an error in ``SPOOLABLE_ERRORS`` (``take_undelivered``:
  it also asks ``maintain`` to purge librdkafka's queue, so what was queued behind that message
  follows it into the spool, in order, ahead of newer batches), librdkafka's queue full
  (``overflow``), or the producer closing with messages still in librdkafka (``keep_the_rest``).
- SPOOLING -> REPLAYING (``step``): the spool holds messages, the partition count is known and the
  back-off is over. The group is up to ``_replay_window`` messages from the head; messages older than
  ``spool_max_age_s`` are not sent (counted ``spool_lost_records`` when the group commits), and the
  group ends early when librdkafka's queue is full or a message is refused on ``produce`` in a way a
  retry may fix.
- REPLAYING -> SPOOLING, committed (``_finish``, when the group's last delivery report came): every
  message of the group has its counter (delivered, too old, refused for good, or failing with an
  unclassified error ``REPLAY_ATTEMPTS_MAX`` times in a row), so the spool's head moves past the
  group; the window grows fourfold (up to ``REPLAY_WINDOW_MAX``) and the back-off goes back to 0.25 s.
- REPLAYING -> SPOOLING, retried (``_finish``): a message failed in a way a retry may fix
  (``ReplayFault.OUTAGE``, or ``OTHER`` fewer than ``REPLAY_ATTEMPTS_MAX`` times in a row), or
  librdkafka's queue was full at the group's first message: nothing is committed and the whole group
  goes again, in order, after the back-off (doubled each time, up to ``REPLAY_BACKOFF_MAX_S``),
  probing with a window of one message.
- SPOOLING -> DIRECT (``step``): nothing waits on disk and no group is in flight: the outage is over.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, KafkaException, Message, Producer

from ccld.producers.spool import Position, Spool, SpooledMessage
from ccld.records import metrics_partition, to_signed64
from ccld.settings import Settings

#: the producer's logger, not this module's: these lines were the producer's before the replay had a
#: module of its own, and operators find (and filter) them under that name
log = logging.getLogger("ccld.producers.kafka")

#: delivery errors that mean "the broker did not take it (yet)": worth spooling and replaying.
#: Anything else (message too large, authorization, ...) would fail again: counted lost at once.
SPOOLABLE_ERRORS = frozenset({
    KafkaError._MSG_TIMED_OUT, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError._UNKNOWN_TOPIC,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NETWORK_EXCEPTION,
})  # fmt: skip

#: delivery errors on replay that the same bytes would get again, so replaying them once more cannot help.
#: librdkafka has already retried what it deems retriable before it reports an error, and the error a
#: delivery report carries has ``retriable()`` False whatever the code (the binding does not set it), so
#: the decision is ours, by code:
#: - size: the message (or its batch) is larger than the broker or topic accepts; it never shrinks.
#: - content: the broker could not validate the record, or its timestamp is outside the topic's
#:   ``message.timestamp.difference.max.ms`` (a spooled message only gets older).
#: - authorization / invalid topic name: fixing it takes an operator; the same refusal already counts
#:   a fresh message lost (``error_records``), and a spool that waits for an ACL blocks everything behind.
#: Not here: UNKNOWN_TOPIC_OR_PART stays in ``SPOOLABLE_ERRORS`` (an outage): a broker that restarted
#: empty (the embedded one keeps topics in memory; ``ccld up`` creates them again) answers it until the
#: topics are back, and no single reply tells "not yet" from "never"; a topic gone for good ends in the
#: age bound instead (``spool_max_age_s``: its records are discarded and counted ``spool_lost_records``).
PERMANENT_ERRORS = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_MSG_SIZE,
    KafkaError.INVALID_MSG, KafkaError.INVALID_RECORD, KafkaError.INVALID_TIMESTAMP,
    KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_EXCEPTION, KafkaError.POLICY_VIOLATION,
})  # fmt: skip


class ReplayFault(enum.Enum):
    """What a delivery error of a replayed message says: wait for the broker, or move past the message."""

    #: the broker is away or not ready (``SPOOLABLE_ERRORS``): replay the same messages again later,
    #: however long it takes; the spool's age bound is what limits the wait
    OUTAGE = "outage"
    #: the message is refused and would be again (``PERMANENT_ERRORS``, or a fatal client error):
    #: count it lost (``replay_rejected_records``) and replay what follows
    PERMANENT = "permanent"
    #: any other error: replayed again up to ``SpoolReplay.REPLAY_ATTEMPTS_MAX`` times in a row,
    #: then counted lost like a permanent one, so no single message holds the spool forever
    OTHER = "other"


def replay_fault(err: KafkaError) -> ReplayFault:
    """Classify one delivery (or produce) error of a replayed message."""
    code = err.code()
    if err.fatal() or code in PERMANENT_ERRORS:
        return ReplayFault.PERMANENT
    if code in SPOOLABLE_ERRORS:
        return ReplayFault.OUTAGE
    return ReplayFault.OTHER


def key_partition(key: bytes, partitions: int, groups: int = 1) -> int:
    """``metrics_partition`` from a message key (``batch_key``: the job and the first row's communicator)."""
    job, comm, _ = key.decode(errors="replace").rsplit("/", 2)
    try:
        h = int(comm, 16)
    except ValueError:
        h = 0
    return metrics_partition(job, to_signed64(h), partitions, groups)


class Count(Protocol):
    """The producer's ``_count``: add to counters by name."""

    def __call__(self, **changes: int) -> None: ...


class Lose(Protocol):
    """The producer's ``_lose``: count records lost for a reason (a counter name)."""

    def __call__(self, key: str, records: int, *, messages: int = 0, value: bytes | None = None) -> None: ...


class _Group:
    """One group of spooled messages in flight: committed only when every one was delivered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # delivery reports of the group may arrive on another polling thread
        self.through: Position | None = None
        self.messages = 0
        self.records = 0
        self.stale_records = 0
        self.waiting = 0
        self.sealed = False  # every message of the group has been handed to librdkafka
        self.finished = False
        self.delivered_records = 0
        self.failed = 0  # messages that failed in a way a retry may fix (OUTAGE or OTHER)
        self.failed_records = 0
        self.outage = False  # one of those failures says the broker is away: retry without a limit
        self.rejected = 0  # messages refused for good (PERMANENT): lost whatever happens next
        self.rejected_records = 0
        self.errors: list[str] = []  # the distinct errors, for the one log line

    def note_error(self, err: KafkaError | None, records: int) -> None:
        """Count one failed message of the group (call with ``lock`` held); None: an unexplained failure."""
        fault = ReplayFault.OTHER if err is None else replay_fault(err)
        if fault is ReplayFault.PERMANENT:
            self.rejected += 1
            self.rejected_records += records
        else:
            self.failed += 1
            self.failed_records += records
            self.outage = self.outage or fault is ReplayFault.OUTAGE
        name = "unknown error" if err is None else f"{err.name()}: {err.str()}"
        if name not in self.errors:
            self.errors.append(name)


class SpoolReplay:
    """The spool of one ``MetricsProducer``: what goes to it, and its replay (states in the module doc).

    The producer calls it with its ``_send_lock`` held (the sender thread, ``send_batch``, ``flush``),
    except ``take_undelivered`` and the replay's own delivery reports, which run on whichever thread
    polls librdkafka, and ``keep_the_rest`` at close. It reaches the producer only through what it is
    given: ``client`` (librdkafka's producer, created on first use), ``partitions`` (the metrics topic's
    partition count, None until a broker told it), ``count`` and ``lose`` (the producer's counters)
    and ``stats_line``.
    """

    #: spooled messages replayed per round trip at most (one while the broker is being probed)
    REPLAY_WINDOW_MAX = 512
    #: wait between replay attempts while the broker keeps failing, at most
    REPLAY_BACKOFF_MAX_S = 5.0
    #: attempts in a row at the spool's head that fail with an unclassified error (``ReplayFault.OTHER``)
    #: before its failed messages are counted lost and the replay moves on (outages never count)
    REPLAY_ATTEMPTS_MAX = 5

    def __init__(self, settings: Settings, *, client: Callable[[], Producer], partitions: Callable[[], int | None],
                 count: Count, lose: Lose, stats_line: Callable[[], str]) -> None:
        self.settings = settings
        self._client = client
        self._partitions = partitions
        self._count = count
        self._lose = lose
        self._stats_line = stats_line
        self.spool: Spool | None = None
        self._spool_tried = False
        self._outage = False  # a message was not taken: new batches go to the spool behind the older ones
        self._purge_wanted = False
        self._group: _Group | None = None
        self._replay_window = 1
        self._replay_backoff_s = 0.25
        self._next_replay_s = 0.0
        self._replay_attempts = 0  # failed attempts (OTHER errors only) since the spool's head last moved
        self._rejections_logged: set[str] = set()  # replay errors already logged as a warning

    # --- the spool ----------------------------------------------------------------------------

    def open(self) -> None:
        """Open (once) the spool slot; it may scan leftovers of a dead process, so never on the caller's path."""
        if self._spool_tried or not self.settings.spool_dir:
            return
        self._spool_tried = True
        try:
            spool = Spool(self.settings.spool_dir, max_bytes=int(self.settings.spool_max_mb * 1024 * 1024),
                          max_age_s=self.settings.spool_max_age_s)
        except OSError as exc:
            log.error("cannot open the spool %s (%s); records the broker does not take will be lost",
                      self.settings.spool_dir, exc)
            return
        self._count(recovered_records=spool.recovered_records)
        if spool.recovered_records:
            log.warning("spool %s holds %d records of an earlier process; they will be replayed",
                        spool.dir, spool.recovered_records)
        self.spool = spool

    def close(self) -> None:
        """Release the spool slot; what it holds stays on disk for the next process."""
        if self.spool is not None:
            self.spool.close()

    @property
    def pending_messages(self) -> int:
        """Messages waiting on disk (0 without a spool)."""
        return self.spool.pending_messages if self.spool is not None else 0

    @property
    def spooled_records(self) -> int:
        """Records waiting on disk (0 without a spool): ``stats['spooled_records']``."""
        return self.spool.pending_records if self.spool is not None else 0

    # --- what goes to the spool ---------------------------------------------------------------

    @property
    def spooling(self) -> bool:
        """New batches go to the spool: during an outage, behind older spooled messages (keep the order:
        the replay sends them when their turn comes), or while no broker has told the partition count
        (the replay picks it then)."""
        spool = self.spool
        return spool is not None and bool(self._outage or spool.pending_messages or self._partitions() is None)

    def keep(self, msg: SpooledMessage) -> bool:
        """Keep ``msg`` on disk; a full spool counts it lost."""
        spool = self.spool
        if spool is None:
            return False
        try:
            ok = spool.append(msg)
        except OSError as exc:
            log.warning("cannot write the spool %s: %s", spool.dir, exc)
            ok = False
        if ok:
            self._count(spooled_in_records=msg.records)
        else:
            self._lose("spool_lost_records", msg.records, messages=1, value=msg.value)
        return ok

    def overflow(self, msg: SpooledMessage) -> bool:
        """librdkafka's queue is full: an outage begins, and the disk takes ``msg`` instead."""
        self._outage = True
        return self.keep(msg)

    def take_undelivered(self, err: KafkaError, msg: Message, records: int, stamp_ms: int | None = None) -> bool:
        """A delivery report with ``err``: spool the message when the broker only did not take it (yet).

        True when the spool took charge of it (kept, or counted ``spool_lost_records`` when full);
        False without a spool or for an error that would come again: the caller counts it lost.
        """
        spool = self.spool
        if spool is None or err.code() not in SPOOLABLE_ERRORS:
            return False
        if not self._outage:
            log.warning("the broker did not take a message (%s); spooling to %s until it does",
                        err.str(), spool.dir)
            self._outage = True
            self._purge_wanted = True  # the rest of librdkafka's queue follows, in order, not piecemeal
        ts_type, ts = msg.timestamp()
        # the producer's own record of the stamp first: a failed delivery report has none (type "not available")
        stamp = stamp_ms if stamp_ms is not None else ts if ts_type == TIMESTAMP_CREATE_TIME else None
        part = msg.partition()  # None (or -1) when librdkafka never picked one: the replay derives it from the key
        self.keep(SpooledMessage(key=msg.key() or b"", value=msg.value() or b"", partition=-1 if part is None else part,
                                 records=records, timestamp_ms=stamp))
        return True

    def keep_the_rest(self, producer: Producer | None, undelivered: int) -> bool:
        """At close: keep, do not lose: what librdkafka still holds goes to the spool for the next process.

        ``undelivered``: messages ``flush`` left in librdkafka. True when they (and a replay group in
        flight) were purged: their delivery reports put them in the spool, none is left undelivered.
        """
        if producer is None or self.spool is None or not (undelivered or self._group is not None):
            return False
        self._outage = True
        producer.purge(in_queue=True, in_flight=True)
        producer.poll(0.1)  # serves the purged messages' reports: they land in the spool
        return True

    # --- the replay ---------------------------------------------------------------------------

    def maintain(self, producer: Producer | None) -> None:
        """Purge after an outage began, and replay the spool (call with the producer's ``_send_lock`` held)."""
        if self._purge_wanted and producer is not None:
            self._purge_wanted = False
            # Queued (not yet sent) messages go to the spool now, in order, ahead of newer batches.
            producer.purge(in_queue=True, in_flight=False, blocking=False)
            producer.poll(0)
        self.step()

    def step(self) -> None:
        """Start the next group from the spool's head when its time has come (see the module doc)."""
        spool = self.spool
        if spool is None or self._group is not None:
            return
        if not spool.pending_messages:
            self._outage = False  # nothing waits on disk: new batches go straight to librdkafka again
            return
        partitions = self._partitions()
        if time.monotonic() < self._next_replay_s or partitions is None:
            return
        head = spool.peek(self._replay_window)
        if not head:
            return
        producer = self._client()
        group = self._group = _Group()
        for pos, msg in head:
            last = False  # this message ends the group (it is retried next round, in order, with what follows)
            if spool.is_stale(msg):
                group.stale_records += msg.records
            else:
                partition = msg.partition
                if partition < 0:  # spooled before the partition count was known: the key names job and group
                    partition = key_partition(msg.key, partitions, self.settings.analysis_groups)
                kwargs: dict[str, Any] = {
                    "value": msg.value, "key": msg.key, "partition": partition,
                    "on_delivery": lambda err, _m, r=msg.records: self._on_replayed(group, err, r),
                }
                if msg.timestamp_ms is not None:
                    kwargs["timestamp"] = msg.timestamp_ms
                with group.lock:
                    group.waiting += 1
                try:
                    producer.produce(self.settings.metrics_topic, **kwargs)
                except BufferError:
                    with group.lock:
                        group.waiting -= 1
                    break  # librdkafka's queue is full: the group ends here; the rest stays for the next round
                except KafkaException as exc:
                    # Refused before it was sent (larger than message.max.bytes, unknown partition, ...):
                    # judged like a delivery error, so a message librdkafka never takes cannot hold the head.
                    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                    with group.lock:
                        group.waiting -= 1
                        group.note_error(err, msg.records)
                    last = err is None or replay_fault(err) is not ReplayFault.PERMANENT  # may pass next time
            group.through = pos
            group.messages += 1
            group.records += msg.records
            if last:
                break
        with group.lock:
            group.sealed = True
            done = group.waiting == 0
        if done:
            self._finish(group)
        else:
            producer.poll(0)

    def _on_replayed(self, group: _Group, err: KafkaError | None, records: int) -> None:
        with group.lock:
            group.waiting -= 1
            if err is None:
                group.delivered_records += records
            else:
                group.note_error(err, records)
            done = group.sealed and group.waiting == 0
        if done:
            self._finish(group)

    def _finish(self, group: _Group) -> None:
        with group.lock:
            if group.finished:
                return
            group.finished = True
        spool = self.spool
        if spool is None:  # pragma: no cover - groups exist only with a spool
            return
        give_up = False
        if group.failed and not group.outage:
            # Only unclassified errors: maybe a passing broker state, maybe this message for ever.
            self._replay_attempts += 1
            give_up = self._replay_attempts >= self.REPLAY_ATTEMPTS_MAX
        if group.through is None or (group.failed and not give_up):
            # Nothing committed: the whole group goes again, in order (its delivered part twice:
            # at-least-once, the worker drops duplicate batches by producer and batch_seq).
            self._count(replay_duplicate_records=group.delivered_records)
            self._replay_window = 1  # probe with one message until the broker answers
            self._next_replay_s = time.monotonic() + self._replay_backoff_s
            self._replay_backoff_s = min(self._replay_backoff_s * 2, self.REPLAY_BACKOFF_MAX_S)
        else:
            # Delivered, too old, or refused for good (or failing REPLAY_ATTEMPTS_MAX times in a row):
            # every message of the group has its counter, so the head moves past it.
            spool.commit(group.through, group.messages, group.records)
            self._replay_attempts = 0
            self._count(delivered_records=group.delivered_records, replayed_records=group.delivered_records)
            if group.stale_records:
                self._lose("spool_lost_records", group.stale_records)
                log.warning("discarded %d spooled records older than %.0f s", group.stale_records,
                            self.settings.spool_max_age_s)
            lost = group.rejected_records + group.failed_records
            if lost:
                self._lose("replay_rejected_records", lost, messages=group.rejected + group.failed)
                new = [e for e in group.errors if e not in self._rejections_logged]
                self._rejections_logged.update(new)
                # Once per kind of error as a warning: one oversized message or a missing ACL could
                # otherwise write a line per message; the count is in the stats line.
                log.log(logging.WARNING if new else logging.DEBUG,
                        "the broker refused %d spooled records for good (%s); counted in replay_rejected_records, "
                        "the replay goes on", lost, "; ".join(group.errors))
            self._replay_window = min(self._replay_window * 4, self.REPLAY_WINDOW_MAX)
            self._replay_backoff_s = 0.25
            if not spool.pending_messages:
                log.info("spool replayed; %s", self._stats_line())
        self._group = None
