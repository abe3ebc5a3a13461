"""A bounded on-disk spool for messages the broker did not take, replayed in order when it returns.

Layout: ``<spool_dir>/slot-<n>/`` is owned by one producer process at a time (an ``flock`` on its
``lock`` file), so ranks of one job can share a ``spool_dir`` and a restarted process adopts
what a dead one left behind. A slot holds numbered segment files of length-prefixed,
CRC-checked frames and a ``cursor`` file naming the first frame not yet delivered.

Bounds: ``max_bytes`` (a frame that does not fit is refused and counted by the caller: the
oldest are kept, so what replays is the start of the outage without holes; room comes back a
segment at a time as the replay delivers) and ``max_age_s`` (older frames are discarded at
replay, oldest first, counted). Frames are written with one
``write`` and flushed to the OS, so a crashed process loses nothing already spooled; a torn
last frame (power loss) fails its CRC and ends the segment. No fsync: the spool rides out
broker outages, not machine crashes.

Pure file I/O, no Kafka: ``ccld.producers.spool_replay`` decides what to spool and when to replay.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

#: frame: payload length, CRC-32 of the payload
_FRAME = struct.Struct("<II")
#: payload head: written at (unix s), timestamp_ms (-1: none), partition, records, key length
_HEAD = struct.Struct("<dqiII")
_SEGMENT_BYTES = 8 * 1024 * 1024
_MAX_SLOTS = 4096


@dataclass(frozen=True)
class SpooledMessage:
    """One Kafka message as it will be produced again."""

    key: bytes
    value: bytes
    partition: int
    records: int
    timestamp_ms: int | None = None
    written_s: float = 0.0

    def encode(self) -> bytes:
        head = _HEAD.pack(self.written_s or time.time(), -1 if self.timestamp_ms is None else self.timestamp_ms,
                          self.partition, self.records, len(self.key))
        payload = head + self.key + self.value
        return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload

    @classmethod
    def decode(cls, payload: bytes) -> SpooledMessage:
        written, ts, partition, records, klen = _HEAD.unpack_from(payload)
        key = payload[_HEAD.size : _HEAD.size + klen]
        return cls(key=bytes(key), value=bytes(payload[_HEAD.size + klen :]), partition=partition, records=records,
                   timestamp_ms=None if ts < 0 else ts, written_s=written)


@dataclass(frozen=True)
class Position:
    """Where a frame starts: segment number and byte offset."""

    segment: int
    offset: int


class Spool:
    """One producer's slot of the spool: append at the tail, read and commit at the head."""

    def __init__(self, root: str | Path, *, max_bytes: int, max_age_s: float,
                 segment_bytes: int = _SEGMENT_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.segment_bytes = max(min(segment_bytes, max_bytes // 4), 4096)
        self.root.mkdir(parents=True, exist_ok=True)
        # Delivery reports (which append) can run on more than one polling thread of the producer.
        self._mutex = threading.RLock()
        self.dir, self._lock_file = self._claim_slot()
        self._head = self._read_cursor()
        self._tail_file: BinaryIO | None = None
        self._tail_segment = max([*self._segments(), self._head.segment])
        self.pending_messages, self.pending_records = self._scan()
        self.recovered_records = self.pending_records  # left by an earlier process in this slot

    # --- slots and files -----------------------------------------------------------------------

    def _claim_slot(self) -> tuple[Path, BinaryIO]:
        for n in range(_MAX_SLOTS):
            slot = self.root / f"slot-{n}"
            slot.mkdir(exist_ok=True)
            fh = open(slot / "lock", "ab")  # noqa: SIM115 - held (and the slot owned) until close()
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.close()
                continue
            return slot, fh
        raise OSError(f"all {_MAX_SLOTS} spool slots under {self.root} are taken")

    def _segment_path(self, n: int) -> Path:
        return self.dir / f"{n:012d}.seg"

    def _segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.seg") if p.stem.isdigit())

    def _read_cursor(self) -> Position:
        try:
            seg, off = (self.dir / "cursor").read_text().split()
            return Position(int(seg), int(off))
        except (OSError, ValueError):
            return Position(min(self._segments(), default=0), 0)

    def _write_cursor(self, pos: Position) -> None:
        tmp = self.dir / "cursor.tmp"
        tmp.write_text(f"{pos.segment} {pos.offset}\n")
        os.replace(tmp, self.dir / "cursor")

    def _scan(self) -> tuple[int, int]:
        messages = records = 0
        for _pos, msg in self._frames(self._head, limit=None):
            messages += 1
            records += msg.records
        return messages, records

    def _frames(self, pos: Position, limit: int | None) -> list[tuple[Position, SpooledMessage]]:
        out: list[tuple[Position, SpooledMessage]] = []
        if self._tail_file is not None:
            self._tail_file.flush()
        for seg in self._segments():
            if seg < pos.segment:
                continue
            with open(self._segment_path(seg), "rb") as fh:
                fh.seek(pos.offset if seg == pos.segment else 0)
                while limit is None or len(out) < limit:
                    start = fh.tell()
                    head = fh.read(_FRAME.size)
                    if len(head) < _FRAME.size:
                        break
                    size, crc = _FRAME.unpack(head)
                    payload = fh.read(size)
                    if len(payload) < size or zlib.crc32(payload) != crc:
                        log.warning("spool segment %s has a torn frame at %d; the rest is skipped", seg, start)
                        break
                    out.append((Position(seg, start), SpooledMessage.decode(payload)))
            if limit is not None and len(out) >= limit:
                break
        return out

    @property
    def bytes_used(self) -> int:
        return sum(self._segment_path(s).stat().st_size for s in self._segments())

    # --- the producer's side ------------------------------------------------------------------

    def append(self, msg: SpooledMessage) -> bool:
        """Keep ``msg`` at the tail; False (nothing written) when the size bound would be exceeded."""
        frame = msg.encode()
        with self._mutex:
            if self.bytes_used + len(frame) > self.max_bytes:
                return False
            if self._tail_file is None or self._tail_file.tell() + len(frame) > self.segment_bytes:
                self._roll()
            fh = self._tail_file
            if fh is None:  # pragma: no cover - _roll always opens one
                return False
            fh.write(frame)
            fh.flush()  # to the OS: survives a crash of this process
            self.pending_messages += 1
            self.pending_records += msg.records
            return True

    def _roll(self) -> None:
        if self._tail_file is not None:
            self._tail_file.close()
            self._tail_segment += 1
        elif self._segments() and self._segment_path(self._tail_segment).stat().st_size >= self.segment_bytes:
            self._tail_segment += 1
        self._tail_file = open(self._segment_path(self._tail_segment), "ab")  # noqa: SIM115 - the tail stays open

    def peek(self, limit: int) -> list[tuple[Position, SpooledMessage]]:
        """Up to ``limit`` messages from the head, oldest first, with where each one starts."""
        with self._mutex:
            return self._frames(self._head, limit)

    def commit(self, through: Position, messages: int, records: int) -> None:
        """Mark everything up to and including the frame at ``through`` as done; drop whole segments."""
        with self._mutex:
            with open(self._segment_path(through.segment), "rb") as fh:
                fh.seek(through.offset)
                size, _crc = _FRAME.unpack(fh.read(_FRAME.size))
            self._head = Position(through.segment, through.offset + _FRAME.size + size)
            if (self._head.segment < self._tail_segment
                    and self._head.offset >= self._segment_path(self._head.segment).stat().st_size):
                # The head's segment is delivered to its end and closed (appends go to a later one):
                # free it now, not only when the next segment's first frame is delivered; a full
                # spool takes new messages again as soon as a whole segment is done.
                self._head = Position(self._head.segment + 1, 0)
            self.pending_messages = max(self.pending_messages - messages, 0)
            self.pending_records = max(self.pending_records - records, 0)
            if self.pending_messages == 0 and self._tail_file is not None:
                # Empty: start the next message in a fresh segment so every old one can go.
                self._tail_file.close()
                self._tail_file = None
                self._tail_segment += 1
                self._head = Position(self._tail_segment, 0)
            self._write_cursor(self._head)
            for seg in self._segments():
                if seg < self._head.segment:
                    self._segment_path(seg).unlink(missing_ok=True)

    def is_stale(self, msg: SpooledMessage, now_s: float | None = None) -> bool:
        return (time.time() if now_s is None else now_s) - msg.written_s > self.max_age_s

    def close(self) -> None:
        with self._mutex:
            if self._tail_file is not None:
                self._tail_file.close()
                self._tail_file = None
            self._lock_file.close()  # releases the slot's flock
