"""When `ccld up` renews its embedded broker (pure: the clock, memory and activity are passed in), and how it
reads the services' activity from their real /metrics pages."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ccld.stack.renew import SINK, WORKER, Activity, RenewalWatch, activity, metric_sums

QUIET = Activity(records=500, unread=0, open_incidents=0, pending=0, uncommitted=0)


def test_renewed_only_over_the_cap_after_the_quiet_time() -> None:
    w = RenewalWatch(cap_mb=100, quiet_s=60)
    assert not w.observe(0, 150, QUIET)
    assert not w.observe(59, 150, QUIET)
    assert w.observe(61, 150, QUIET)
    under = RenewalWatch(cap_mb=100, quiet_s=60)
    assert not any(under.observe(t, 90, QUIET) for t in range(0, 300, 10))
    off = RenewalWatch(cap_mb=0, quiet_s=60)
    assert not any(off.observe(t, 10_000, QUIET) for t in range(0, 300, 10))


@pytest.mark.parametrize("busy", [
    {"records": 501}, {"unread": 3}, {"open_incidents": 1}, {"pending": 1}, {"uncommitted": 40},
], ids=["records-moving", "unread", "incident-open", "verdict-pending", "sink-unarchived"])
def test_anything_in_flight_starts_the_quiet_time_again(busy: dict[str, float]) -> None:
    w = RenewalWatch(cap_mb=100, quiet_s=60)
    w.observe(0, 150, QUIET)
    assert not w.observe(50, 150, Activity(**{**QUIET.__dict__, **busy}))
    assert not w.observe(100, 150, QUIET if "records" not in busy else Activity(**{**QUIET.__dict__, **busy}))
    assert w.observe(170, 150, QUIET if "records" not in busy else Activity(**{**QUIET.__dict__, **busy}))


def test_a_service_that_does_not_answer_is_never_quiet() -> None:
    w = RenewalWatch(cap_mb=100, quiet_s=60)
    w.observe(0, 150, QUIET)
    assert not w.observe(61, 150, None)
    assert not w.observe(100, 150, QUIET)
    w.renewed(200)
    assert not w.observe(210, 150, QUIET) and w.observe(271, 150, QUIET)


class _Pages(BaseHTTPRequestHandler):
    pages: dict[str, str] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = self.pages.get(self.path)
        if body is None:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_activity_sums_the_workers_partitions_and_the_sink(server: str) -> None:
    """The pages are rendered by the worker's and the sink's own metrics code."""
    from ccld.settings import AnalyzerSettings, Settings
    from ccld.streams.lag import LagWatch
    from ccld.streams.processor import PartitionProcessor
    from ccld.streams.worker_metrics import WorkerMetrics
    from ccld.streams.worker_state import WorkerState
    from factories import make_verdict

    class Table:
        data: dict[bytes, bytes] = {}

    st: WorkerState[PartitionProcessor] = WorkerState(
        Settings(), Table(), "m", restore=lambda p, raw, parts: PartitionProcessor.restore(p, AnalyzerSettings(), raw))
    st.processor(0).counters["records"] = 70
    st.processor(1).counters["records"] = 30
    st.processor(1).counters["unread_messages"] = 2
    st.processor(1).found([make_verdict()])
    _Pages.pages = {"/w": WorkerMetrics([st], LagWatch()).render(),
                    "/s": "# TYPE ccld_sink_uncommitted_messages gauge\nccld_sink_uncommitted_messages 7\n"}
    no_broker = Settings(bootstrap="127.0.0.1:1")
    assert activity([server + "/w"], [server + "/s"], no_broker) is None, "a broker that does not say is not quiet"
    assert activity([server + "/w"], [server + "/missing"], no_broker) is None
    assert activity([], [server + "/s"], no_broker) is None
    sums = [metric_sums(server + "/w", WORKER), metric_sums(server + "/s", SINK)]
    assert sums == [{"ccld_worker_records_total": 100, "ccld_worker_unread_messages": 2,
                     "ccld_worker_open_incidents": 0, "ccld_worker_pending_verdicts": 1},
                    {"ccld_sink_uncommitted_messages": 7}]
