"""`ccld verdicts` as a person runs it: filters and line format on the real broker, and brokers that are gone."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer

from ccld.records import AnomalyKind, Verdict, VerdictState
from ccld.schemas.codec import encode_verdict
from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker, free_port
from ccld.topics import ensure_topics
from factories import make_verdict

pytestmark = pytest.mark.integration

#: how librdkafka's own stderr lines start (``%3|1796194283.564|FAIL|rdkafka#consumer-1| ...``)
RAW_LIBRDKAFKA = re.compile(r"^%\d\|", re.M)


def verdicts(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    return subprocess.Popen([sys.executable, "-P", "-m", "ccld.cli", "verdicts", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def finish(proc: subprocess.Popen[str], timeout_s: float = 60) -> tuple[str, str]:
    """Its output once it exits; a tail that does not exit within ``timeout_s`` is killed and fails the test."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"ccld verdicts did not exit within {timeout_s} s:\n{err[-3000:]}") from None


def test_an_unreachable_broker_is_one_useful_line_and_a_failure_within_seconds() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    proc = verdicts("--bootstrap", address)
    out, err = finish(proc)
    took = time.monotonic() - t0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode != 0 and took < 15, (proc.returncode, took, err)
    assert not RAW_LIBRDKAFKA.search(err) and "FAIL" not in err, err
    assert len(lines) == 1, err
    assert f"cannot reach Kafka at {address} (Connection refused): check" in lines[0], lines[0]
    assert out == ""


def test_a_tail_whose_broker_is_gone_exits_with_one_line() -> None:
    broker = EmbeddedBroker(0).start()
    try:
        s = Settings.load({}, bootstrap=broker.bootstrap, topic_prefix=f"gone{time.time_ns()}.")
        ensure_topics(s)
        proc = verdicts("--bootstrap", broker.bootstrap, "--topic-prefix", s.topic_prefix, "--broker-timeout-s", "3")
        time.sleep(3)  # tailing, connected
        assert proc.poll() is None, finish(proc)
    finally:
        broker.stop()
    gone = time.monotonic()
    out, err = finish(proc)
    assert proc.returncode == 2 and time.monotonic() - gone < 15, (proc.returncode, err)
    assert not RAW_LIBRDKAFKA.search(err), err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"ccld verdicts: lost Kafka at {broker.bootstrap}: no broker answered for "), err


def publish(settings: Settings, vs: list[Verdict]) -> None:
    p = Producer({"bootstrap.servers": settings.bootstrap})
    for v in vs:
        p.produce(settings.verdicts_topic, key=v.incident_id.encode(), value=encode_verdict(v))
    assert p.flush(20) == 0


def test_job_kind_and_state_filters_and_the_line_format(ccld_settings: Settings) -> None:
    t = 1_760_000_007.0
    publish(ccld_settings, [
        make_verdict(incident_id="a1", job="job-a", kind=AnomalyKind.H1, detected_time=t),
        make_verdict(incident_id="a1", job="job-a", kind=AnomalyKind.H1, state=VerdictState.RESOLVED,
                     detected_time=t + 60),
        make_verdict(incident_id="a2", job="job-a", kind=AnomalyKind.S2, detected_time=t),
        make_verdict(incident_id="b1", job="job-b", kind=AnomalyKind.H1, detected_time=t),
    ])
    common = ("--from-beginning", "--timeout", "3", "--bootstrap", ccld_settings.bootstrap,
              "--topic-prefix", ccld_settings.topic_prefix)

    def lines(*flags: str) -> list[str]:
        proc = verdicts(*common, *flags)
        out, err = finish(proc)
        assert proc.returncode == 0, err
        return out.splitlines()

    everything = lines()
    assert len(everything) == 4
    assert everything[0].startswith("2025-10-09T08:53:27Z job=job-a [open] H1 "), everything[0]
    got = lines("--job", "job-a", "--kind", "hang")
    assert [ln.split()[1:4] for ln in got] == [["job=job-a", "[open]", "H1"], ["job=job-a", "[resolved]", "H1"]]
    assert [ln.split()[0] for ln in got] == ["2025-10-09T08:53:27Z", "2025-10-09T08:54:27Z"]
    assert [ln.split()[1] for ln in lines("--state", "open", "--kind", "H1")] == ["job=job-a", "job=job-b"]
