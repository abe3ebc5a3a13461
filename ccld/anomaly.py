"""The six anomaly classes, one row each: what every stage needs to know about a class, in one table.

``AnomalyKind`` is the enum on the wire (``Verdict.kind``). ``CLASSES`` says, per class, its
family (hang or slow: incidents are matched within a family), its precedence (an incident only
ever moves to a more specific class of its family), how its root cause is named, which analyzer
setting holds its threshold, what the simulator changes to inject it, and what an operator
checks first. The analyzer (incidents, job stage, hang thresholds), the simulator (scenario
fields, fault effects) and the docs read these rows instead of spelling the classes out again.

To add a class: a member here, a row in ``CLASSES``, a detector that yields it (``streams/analysis``),
and its evidence wording next to the detector; docs/architecture.md has the whole recipe.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


class AnomalyKind(enum.StrEnum):
    """The six root-cause classes of the paper."""

    H1 = "H1"  # not-entered hang: the culprit never entered an op its peers entered
    H2 = "H2"  # inconsistent hang: ranks entered ops whose signatures or order differ
    H3 = "H3"  # hardware-fault hang: consistent op, data movement stopped on a link
    S1 = "S1"  # comp-slow: a late arriver makes everyone wait (P >= beta)
    S2 = "S2"  # comm-slow: the communication itself is slow (P <= alpha)
    S3 = "S3"  # mixed-slow: both (alpha < P < beta)

    @property
    def is_hang(self) -> bool:
        return CLASSES[self].family is Family.HANG

    @property
    def info(self) -> AnomalyClass:
        """This class's row of ``CLASSES``."""
        return CLASSES[self]


class Family(enum.StrEnum):
    """Hangs stop progress, slowdowns do not; an incident never changes family."""

    HANG = "hang"
    SLOW = "slow"


class Effect(enum.Flag):
    """What the simulator changes on the faulty rank or link to inject a class."""

    ABSENT = enum.auto()  # the rank stops issuing ops (never enters the next one)
    MISMATCH = enum.auto()  # the rank issues an op that differs from its peers'
    LINK_STOP = enum.auto()  # data stops moving on one link
    COMPUTE = enum.auto()  # the rank computes slower before each op
    LINK = enum.auto()  # one link moves data slower


@dataclass(frozen=True)
class AnomalyClass:
    """One row of the class table."""

    kind: AnomalyKind
    title: str
    family: Family
    #: within the family; an incident moves only to a class of higher precedence (S3 is S1 and S2 at once)
    precedence: int
    #: how the root cause is named: which ranks, and whether a link is part of it
    root: str
    #: what the simulator changes to inject it
    effect: Effect
    #: the simulator's fault fields and their defaults (``None``: required, or derived)
    fault_fields: Mapping[str, Any]
    #: the ``AnalyzerSettings`` field with the class's stall threshold (hangs only)
    threshold_setting: str | None
    #: what an operator checks first on real hardware
    action: str
    names_link: bool = field(default=False)


_SLOW_PHASES = {"on_s": None, "off_s": 0.0}
#: where a link fault sits: the communicator family of the link ``rank -> peer`` (tp, dp, pp), or a
#: whole host's network interface (``nic``: every network link leaving that host; then no rank/peer)
_LINK_TARGET = {"comm": "tp", "nic": None}

#: Every class, in the order of the enum.
CLASSES: Mapping[AnomalyKind, AnomalyClass] = MappingProxyType({
    AnomalyKind.H1: AnomalyClass(
        AnomalyKind.H1, "not-entered hang", Family.HANG, 0,
        "the ranks that never entered the op their peers wait in (victims waiting elsewhere are not roots)",
        Effect.ABSENT, {"rank": None, "onset_s": 60.0}, "hang_min_s",
        "look at the named rank's process: py-spy dump or gdb for where it is stuck (data loader, I/O, a "
        "crash, a deadlock on the GIL); its host's kernel log for an OOM kill"),
    AnomalyKind.H2: AnomalyClass(
        AnomalyKind.H2, "inconsistent hang", Family.HANG, 2,
        "the minority whose op differs (type, dtype, count, root, order) or whose send/recv has no partner",
        Effect.MISMATCH, {"rank": None, "onset_s": 60.0, "mismatch": "dtype"}, "h2_min_s",
        "a code path that differs by rank: the named rank issued a different collective; compare its call "
        "stack with a peer's (a rank-dependent branch, an uneven batch, a skipped step)"),
    AnomalyKind.H3: AnomalyClass(
        AnomalyKind.H3, "hardware-fault hang", Family.HANG, 1,
        "the rank (and link) where the send/recv counter chain breaks",
        Effect.LINK_STOP, {"rank": None, "peer": None, **_LINK_TARGET, "onset_s": 60.0}, "h3_min_s",
        "the named link: NIC and port counters (ibstat, ethtool -S, perfquery), the cable and switch port; "
        "NVLink errors (nvidia-smi nvlink -e) inside a node; the GPU's Xid errors in the kernel log",
        names_link=True),
    AnomalyKind.S1: AnomalyClass(
        AnomalyKind.S1, "comp-slow", Family.SLOW, 0,
        "the late arriver: its own kernel time stays normal while its peers wait for it",
        Effect.COMPUTE, {"rank": None, "onset_s": 60.0, "factor": 4.0, **_SLOW_PHASES}, None,
        "the named rank's node: GPU clocks and thermals (nvidia-smi -q -d CLOCK,PERFORMANCE), throttling, "
        "CPU contention, a slow data loader or storage, Python GC pauses"),
    AnomalyKind.S2: AnomalyClass(
        AnomalyKind.S2, "comm-slow", Family.SLOW, 1,
        "the link where the send backlog builds (its source rank), when counters show it",
        Effect.LINK, {"rank": None, "peer": None, **_LINK_TARGET, "onset_s": 60.0, "factor": 0.25, **_SLOW_PHASES},
        None,
        "the named link's NIC and cable: error and retransmit counters (ethtool -S, ibstat, perfquery), "
        "link speed and width, congestion on the switch port",
        names_link=True),
    AnomalyKind.S3: AnomalyClass(
        AnomalyKind.S3, "mixed-slow", Family.SLOW, 2,
        "the rank that computes slowly and whose outgoing link is slow, and that link",
        Effect.COMPUTE | Effect.LINK,
        {"rank": None, "peer": None, "comm": "tp", "onset_s": 60.0, "compute_factor": 1.3, "link_factor": 0.25,
         **_SLOW_PHASES},
        None,
        "both: the named rank's GPU clocks and thermals, and its outgoing link's NIC counters",
        names_link=True),
})


def kinds_of(family: Family) -> tuple[str, ...]:
    """The class names of one family, in enum order (``("H1", "H2", "H3")``)."""
    return tuple(k.value for k, c in CLASSES.items() if c.family is family)


def kinds_with(effect: Effect) -> tuple[str, ...]:
    """The class names whose injection changes ``effect`` (``kinds_with(Effect.LINK)``: S2, S3)."""
    return tuple(k.value for k, c in CLASSES.items() if c.effect & effect)
