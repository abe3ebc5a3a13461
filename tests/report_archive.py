"""A small hand-made Parquet archive for `ccld report` tests: one H1 and one S2 incident of a 4-rank job.

Written with the sink's own writers (``sinks/parquet.py``, ``sinks/layout.py``) from ``factories`` records. The job runs
one all-reduce a second on communicator ``COMM``; ranks 2 and 3 sit on a host whose clock is
``SKEW_S`` ahead. Each op's records are shipped ``SHIP_S`` after the op's second began (analyzer
clock = Kafka timestamps, from ``T0``). From second ``HANG_AT`` rank 3 never enters op ``HANG_AT``
(H1) while ranks 0-2 wait in it; from second ``SLOW_AT`` rank 1's send backlog grows (the S2).
"""

from __future__ import annotations

from pathlib import Path

from ccld.records import AnomalyKind, KernelBatch, KernelRecord, Link, Status, Verdict, VerdictState, comm_hex
from ccld.sinks.layout import write_offsets
from ccld.sinks.parquet import file_path, metrics_table, verdicts_table, write_atomic
from factories import make_kernel_record, make_verdict

T0 = 1_750_000_000.0
COMM = 0x1234_5678_9ABC_DEF0
SKEW_S = 5.0
SHIP_S = 0.5
ENTER_S, EXIT_S = 0.1, 0.3
HANG_AT = 30
SLOW_AT = 10
SECONDS = 60
JOB = "job-r"
H1_ID = "h-0123456789abcdef"
S2_ID = "s-fedcba9876543210"
H1_EVIDENCE = "ranks 0-2 entered ALL_REDUCE #30 and waited 20.0 s; rank 3 never entered"
S2_EVIDENCE = "all_reduce took 3x its baseline; send backlog builds at link 1->2 channel 0"


def _ns(rank: int, analyzer_s: float) -> int:
    """An analyzer-clock time as rank ``rank``'s own clock reads it."""
    return int(round((T0 + analyzer_s + (SKEW_S if rank >= 2 else 0.0)) * 1e9))


def _rec(rank: int, **over: object) -> KernelRecord:
    return make_kernel_record(job=JOB, comm_hash=COMM, rank=rank, comm_rank=rank, comm_size=4, world_size=4,
                              host=f"node-{rank // 2}", **over)


def batches() -> list[tuple[float, KernelBatch]]:
    """(analyzer time, batch): one message per second with every rank's records of that second."""
    out = []
    for s in range(SECONDS):
        recs = []
        for rank in range(4):
            if s < HANG_AT:
                lag = (5 + s, 5) if rank == 1 and s >= SLOW_AT else (5, 5)
                recs.append(_rec(rank, op_seq=s, status=Status.PROGRESS, t_enter_ns=_ns(rank, s + ENTER_S),
                                 t_exit_ns=-1, t_sample_ns=_ns(rank, s + 0.2), send_counts=(lag[1], 4),
                                 recv_counts=(lag[0], 4)))
                recs.append(_rec(rank, op_seq=s, status=Status.DONE, t_enter_ns=_ns(rank, s + ENTER_S),
                                 t_exit_ns=_ns(rank, s + EXIT_S), t_sample_ns=_ns(rank, s + EXIT_S)))
            elif rank < 3:  # waiting in op HANG_AT, sampled every second, never leaving it
                recs.append(_rec(rank, op_seq=HANG_AT, status=Status.PROGRESS,
                                 t_enter_ns=_ns(rank, HANG_AT + ENTER_S), t_exit_ns=-1,
                                 t_sample_ns=_ns(rank, s + 0.2), send_counts=(3, 3), recv_counts=(3, 3)))
            # rank 3 sends nothing from HANG_AT on: it is stuck outside any collective
        out.append((T0 + s + SHIP_S, KernelBatch.from_records(recs)))
    return out


def verdicts() -> list[Verdict]:
    h1 = dict(incident_id=H1_ID, kind=AnomalyKind.H1, job=JOB, communicator=comm_hex(COMM), op_seq=HANG_AT,
              op_type="all_reduce", root_cause_ranks=(3,), root_cause_hosts=("node-1",), affected_ranks=(0, 1),
              confidence=0.95, evidence=H1_EVIDENCE, onset_time=T0 + HANG_AT + ENTER_S)
    s2 = dict(incident_id=S2_ID, kind=AnomalyKind.S2, job=JOB, communicator=comm_hex(COMM), op_seq=SLOW_AT + 3,
              op_type="all_reduce", root_cause_ranks=(1, 2), affected_ranks=(0, 1, 2, 3), confidence=0.8,
              evidence=S2_EVIDENCE, onset_time=T0 + SLOW_AT, link=Link(1, 2), channel=0, p=0.05)
    return [
        make_verdict(**s2, state=VerdictState.OPEN, detected_time=T0 + SLOW_AT + 5),
        make_verdict(**h1, state=VerdictState.OPEN, detected_time=T0 + HANG_AT + 20),
        make_verdict(**{**h1, "affected_ranks": (0, 1, 2)}, state=VerdictState.UPDATE,
                     detected_time=T0 + HANG_AT + 22),
        make_verdict(**{**h1, "affected_ranks": (0, 1, 2)}, state=VerdictState.UPDATE,
                     detected_time=T0 + HANG_AT + 22),  # a repeat (at-least-once delivery): shown once
        make_verdict(**s2, state=VerdictState.RESOLVED, detected_time=T0 + HANG_AT + 1),
        make_verdict(**{**h1, "affected_ranks": (0, 1, 2)}, state=VerdictState.CLOSED,
                     detected_time=T0 + SECONDS + 60, details={"closed": "job silent for 60 s"}),
    ]


def write_archive(root: Path, metrics_topic: str = "ccl-d.metrics", verdicts_topic: str = "ccl-d.verdicts", *,
                  old_layout: bool = False) -> Path:
    """The archive under ``root``, metrics in two files as a sink flushing twice would write them.

    ``old_layout``: as a sink before the Hive layout wrote it (``<topic>/<partition>/<incarnation>/<offset>``)."""
    bs = batches()
    half = len(bs) // 2
    for start, part in ((0, bs[:half]), (half, bs[half:])):
        rows = [(start + i, int(round(t * 1e3)), b) for i, (t, b) in enumerate(part)]
        if old_layout:
            write_atomic(metrics_table(rows), file_path(root, metrics_topic, 0, start, "sink-1"), rows[-1][0])
        else:
            write_offsets(root, metrics_topic, 0, "sink-1", start, rows[-1][0], metrics_table(rows))
    vs = [(i, int(round(v.detected_time * 1e3)), v) for i, v in enumerate(verdicts())]
    if old_layout:
        write_atomic(verdicts_table(vs), file_path(root, verdicts_topic, 0, 0, "sink-1"), len(vs) - 1)
    else:
        write_offsets(root, verdicts_topic, 0, "sink-1", 0, len(vs) - 1, verdicts_table(vs))
    return root


#: the fleet archive's hosts: gpu-bad's GPU root cause in four jobs, gpu-nic's network twice, three once
FLEET_INCIDENTS = [("gpu-bad", "S1", "train-a", 20.0), ("gpu-bad", "S1", "train-b", 14.0),
                   ("gpu-bad", "H1", "train-c", 9.0), ("gpu-bad", "S3", "train-d", 2.0),
                   ("gpu-nic", "S2", "train-b", 13.0), ("gpu-nic", "H3", "train-e", 6.0),
                   ("gpu-x1", "H2", "train-f", 30.0), ("gpu-x2", "S2", "train-g", 3.0),
                   ("gpu-x3", "S1", "train-a", 1.0)]


def write_fleet_archive(root: Path, now: float, verdicts_topic: str = "ccl-d.verdicts") -> Path:
    """Verdicts of several jobs over the last 30 hours naming ``FLEET_INCIDENTS``' hosts (hours ago)."""
    vs = [make_verdict(incident_id=f"f{n}", job=job, kind=AnomalyKind(kind), root_cause_hosts=(host,),
                       root_cause_ranks=(n,), affected_ranks=(n + 1,), evidence=f"{kind} on {host}",
                       detected_time=now - hours * 3600)
          for n, (host, kind, job, hours) in enumerate(FLEET_INCIDENTS)]
    rows = [(i, int(round(v.detected_time * 1e3)), v) for i, v in enumerate(vs)]
    write_offsets(root, verdicts_topic, 0, "sink-1", 0, len(rows) - 1, verdicts_table(rows))
    return root
