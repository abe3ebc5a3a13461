"""The README's DuckDB queries, run as they are printed against an archive the sink's consume path wrote."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ccld.records import KernelBatch, Status, VerdictState
from ccld.schemas.codec import encode_batch, encode_verdict
from ccld.settings import Settings
from ccld.sinks.archiver import Archiver
from ccld.sinks.catalog import scan
from factories import make_kernel_record, make_verdict

duckdb = pytest.importorskip("duckdb", reason="duckdb is in the test extra: pip install -e '.[test]'")

README = Path(__file__).resolve().parents[3] / "README.md"
DAY = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.UTC)  # the day the README's second query asks for
COMM = "123456789abcdef0"  # make_kernel_record's communicator


class Ids:
    def labels(self, topics: Sequence[str], timeout_s: float) -> dict[str, str]:
        return dict.fromkeys(topics, "id-" + "c" * 32)


class Commits:
    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        pass


def readme_queries() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Querying the archive"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


def ms(t: dt.datetime) -> int:
    return int(t.timestamp() * 1000)


def op_batch(job: str, seq: int, enter: dt.datetime) -> KernelBatch:
    """Op ``seq`` done by 4 ranks (rank r took (r + 1) * (seq + 1) ms), and rank 3 still sampling it once."""
    t0 = int(enter.timestamp() * 1e9)
    done = [make_kernel_record(job=job, rank=r, comm_rank=r, op_seq=seq, t_enter_ns=t0,
                               t_exit_ns=t0 + (r + 1) * (seq + 1) * 1_000_000, t_sample_ns=t0 + 50_000_000)
            for r in range(4)]
    progress = make_kernel_record(job=job, rank=3, comm_rank=3, op_seq=seq, status=Status.PROGRESS, t_enter_ns=t0,
                                  t_exit_ns=-1, t_sample_ns=t0 + 500_000)
    return KernelBatch.from_records([progress, *done])


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    """Two jobs over two metrics partitions and two days, and their verdicts, as the sink archives them."""
    s = Settings.load({}, bootstrap="127.0.0.1:1", archive_dir=str(tmp_path / "ccld-archive"), sink_max_rows=1)
    arch = Archiver(s)
    arch._ids = Ids()  # type: ignore[assignment]
    c = Commits()
    before = DAY - dt.timedelta(days=1)
    metrics = [("my-train", 0, before), ("my-train", 1, DAY), ("other", 1, DAY),
               ("my-train", 2, DAY + dt.timedelta(seconds=0.5)), ("my-train", 3, DAY + dt.timedelta(seconds=1))]
    for offset, (job, seq, t) in enumerate(metrics):
        arch._take(c, s.metrics_topic, seq % 2, offset, ms(t) + 200, encode_batch(op_batch(job, seq, t)))
    verdicts = [
        make_verdict(job="my-train", incident_id="i1", detected_time=DAY.timestamp() + 30, evidence="rank 3 hangs",
                     root_cause_ranks=(3,)),
        make_verdict(job="other", incident_id="i2", detected_time=DAY.timestamp() + 31),
        make_verdict(job="my-train", incident_id="i1", state=VerdictState.RESOLVED, root_cause_ranks=(3,),
                     detected_time=DAY.timestamp() + 90, evidence="rank 3 hangs"),
    ]
    for offset, v in enumerate(verdicts):
        arch._take(c, s.verdicts_topic, 0, offset, ms(DAY) + 1000 * offset, encode_verdict(v))
    arch._flush_all(c, force=False)
    assert arch.counters["rows"] == 5 * 5 + 3
    return tmp_path / "ccld-archive"


def run(query: str, root: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    return con.execute(query.replace("'ccld-archive/", f"'{root.as_posix()}/")).fetchall()


def test_the_readme_queries_read_one_jobs_verdicts_and_one_ranks_op_durations(archive: Path) -> None:
    assert {f.job for f in scan(archive)} == {"my-train", "other"} and len(scan(archive)) == 6
    verdicts_q, durations_q = readme_queries()
    assert run(verdicts_q, archive) == [
        (DAY + dt.timedelta(seconds=30), "open", "H1", [3], "rank 3 hangs"),
        (DAY + dt.timedelta(seconds=90), "resolved", "H1", [3], "rank 3 hangs"),
    ]
    # rank 3 took 4 * (seq + 1) ms; op 0 is of the day before, op 1 of "other" too: neither is read
    assert run(durations_q, archive) == [
        (DAY, COMM, 1, "ALL_REDUCE", 8.0),
        (DAY + dt.timedelta(seconds=0.5), COMM, 2, "ALL_REDUCE", 12.0),
        (DAY + dt.timedelta(seconds=1), COMM, 3, "ALL_REDUCE", 16.0),
    ]


def test_the_readme_shows_exactly_the_two_queries_this_file_runs() -> None:
    queries = readme_queries()
    assert len(queries) == 2 and all("read_parquet('ccld-archive/topic=" in q for q in queries), queries
