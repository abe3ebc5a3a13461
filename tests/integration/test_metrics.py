"""/metrics of the real processes, scraped by a real Prometheus: the worker's record count as Prometheus
stores it equals the records produced; the sink's, the alert bridge's and ``ccld up``'s endpoints answer,
and the server helper they share answers only /metrics, survives a broken collector and a taken port.

Prometheus is Debian's (``apt-get install prometheus``), started per test on a free loopback port with
a minimal config that scrapes every second; the tests that need it skip, saying so, only where the
binary is not installed. ``promtool check metrics`` (same package) lints every body scraped here.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from ccld.metrics import CONTENT_TYPE, Family
from ccld.metrics_http import MetricsServer, start_metrics_server
from ccld.producers.kafka import MetricsProducer
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch
from ccld.schemas.codec import encode_verdict
from ccld.settings import Settings
from ccld.stack.broker import free_port
from factories import make_verdict
from harness import WorkerProcess, parse_exposition, scrape, start_up, stop_up

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def job(sid: str, fault: dict[str, Any] | None, duration_s: float) -> list[tuple[float, KernelBatch]]:
    """A small simulated job (16 ranks, simulated time), as test_pipeline produces it."""
    return list(simulate(Scenario.from_dict({
        "id": sid, "seed": 5, "ranks": 16, "layout": {"tp": 8, "pp": 1, "dp": 2}, "channels": 2,
        "step_time_s": 1.0, "duration_s": duration_s, "clock_skew_s": 2.0, "jitter": 0.02,
        "faults": [fault] if fault else [], "expect": [{"kind": fault["kind"], "rank": fault["rank"]}] if fault else [],
    })))


def publish(settings: Settings, batches: list[tuple[float, KernelBatch]]) -> int:
    with MetricsProducer(settings, background=False) as producer:
        for t, batch in batches:
            assert producer.send_batch(batch, timestamp_ms=int(t * 1000))
        assert producer.flush(20) == 0
        assert producer.stats["delivery_failures"] == 0
    return sum(b.n for _, b in batches)


def wait_for(cond: Callable[[], Any], timeout_s: float, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every_s)
    return cond()


def lint(body: str) -> None:
    """``promtool check metrics``: Prometheus' own parser and naming lint (skipped where promtool is absent)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return
    res = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, f"promtool check metrics: {res.stdout}{res.stderr}\n{body[:3000]}"


# --- Prometheus ---------------------------------------------------------------------------------------


class Prometheus:
    """A running Prometheus; ``query`` returns an instant query's vector as ``[(labels, value)]``."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log

    def api(self, path: str, **params: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        data = self.api("/api/v1/query", query=expr)
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def scalar(self, expr: str) -> float | None:
        """The single value of ``expr`` (None while it has no sample)."""
        res = self.query(expr)
        return res[0][1] if res else None


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[list[str]], Prometheus]]:
    """Starts a Prometheus that scrapes the given ``host:port`` targets every second (job ``ccld``)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus is not installed (Debian: apt-get install prometheus); the scrape test needs it")
    started: list[subprocess.Popen[bytes]] = []

    def start(targets: list[str]) -> Prometheus:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: ccld\n    scrape_interval: 1s\n    scrape_timeout: 900ms\n"
            f"    static_configs:\n      - targets: {json.dumps(targets)}\n")
        log = tmp_path / "prometheus.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        started.append(proc)
        prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)

        def ready() -> bool:
            assert proc.poll() is None, f"prometheus exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        assert wait_for(ready, 60, every_s=0.2), f"prometheus not ready:\n{log.read_text()[-3000:]}"
        return prom

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the worker, scraped by Prometheus -----------------------------------------------------------------


def test_prometheus_scrapes_the_worker_and_counts_every_record(
    ccld_settings: Settings, worker_factory: Callable[[Settings], WorkerProcess],
    prometheus: Callable[[list[str]], Prometheus],
) -> None:
    port = free_port()
    worker = worker_factory(ccld_settings.replace(worker_web_port=port)).start()
    prom = prometheus([f"127.0.0.1:{port}"])
    assert wait_for(lambda: prom.scalar('up{job="ccld"}') == 1, 30), f"not scraped:\n{prom.log.read_text()[-2000:]}"

    batches = job("metrics-h1", {"kind": "H1", "rank": 5, "onset_s": 50.0}, duration_s=110.0)
    sent = publish(ccld_settings, batches)
    got = wait_for(lambda: prom.scalar("sum(ccld_worker_records_total)") == sent, 60)
    assert got, (f"Prometheus has sum(ccld_worker_records_total) = {prom.scalar('sum(ccld_worker_records_total)')}, "
                 f"produced {sent}\n{worker.log()}")
    messages = prom.scalar("sum(ccld_worker_messages_total)")
    assert messages is not None and messages >= len(batches), (messages, len(batches))
    # every message handled by the agent is timed once (read-backs are not: at most as many)
    count = prom.scalar("sum(ccld_worker_analysis_seconds_count)")
    assert count is not None and 0 < count <= messages
    assert prom.scalar('sum(ccld_worker_dead_letters_total)') == 0
    # the hang is found and acknowledged: counted by class and state
    opened = wait_for(lambda: prom.scalar('sum(ccld_worker_verdicts_total{kind="H1",state="open"})'), 60)
    assert opened and opened >= 1, worker.log()
    assert prom.scalar("sum(ccld_worker_open_incidents)") is not None
    # the p95 the dashboard shows is computable from the histogram
    assert prom.query("histogram_quantile(0.95, sum by (le) (rate(ccld_worker_analysis_seconds_bucket[1m])))")

    ctype, body = scrape(f"http://127.0.0.1:{port}/metrics")
    assert ctype == CONTENT_TYPE
    lint(body)
    # every query of the Grafana dashboard parses and runs on a real Prometheus
    dash = json.loads((ROOT / "docs" / "grafana-ccld.json").read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            prom.query(target["expr"].replace("$__rate_interval", "1m"))


# --- the server helper the sink, the alert bridge and the aggregator share --------------------------------


def test_the_metrics_server_serves_metrics_only_survives_a_broken_collector_and_a_taken_port(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = {"now": False}

    def collect() -> list[Family]:
        if broken["now"]:
            raise RuntimeError("collector bug")
        return [Family("ccld_demo_total", "counter", "Demo.").add(2)]

    with MetricsServer(collect, port=0) as server:
        ctype, body = scrape(server.url)
        assert ctype == CONTENT_TYPE and body == "# HELP ccld_demo_total Demo.\n# TYPE ccld_demo_total counter\n" \
            "ccld_demo_total 2\n"
        with pytest.raises(urllib.error.HTTPError) as missing:
            scrape(server.url.replace("/metrics", "/other"))
        assert missing.value.code == 404
        broken["now"] = True
        with pytest.raises(urllib.error.HTTPError) as failed:
            scrape(server.url)
        assert failed.value.code == 500 and b"collector bug" in failed.value.read()
        broken["now"] = False
        assert scrape(server.url)[1].endswith("ccld_demo_total 2\n"), "the server survived the failed scrape"
        # a second service on the same port runs on without metrics, and says so once
        assert start_metrics_server(collect, "127.0.0.1", server.port, what="second") is None
        assert "second: no metrics endpoint: cannot listen on 127.0.0.1" in caplog.text
    assert start_metrics_server(collect, "127.0.0.1", 0, what="off") is None, "port 0 is off"


# --- the sink and the alert bridge ---------------------------------------------------------------------


def test_the_sinks_endpoint_counts_the_rows_it_archived(ccld_settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    settings = ccld_settings.replace(sink_metrics_port=port)
    sink = WorkerProcess(settings, tmp_path / "sink.log", command="sink", ready="archiving").start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert f"metrics: {url}" in sink.log()
        ctype, body = scrape(url)
        assert ctype == CONTENT_TYPE and parse_exposition(body)["ccld_sink_rows_total"] == 0
        lint(body)
        sent = publish(settings, job("metrics-sink", None, duration_s=20.0))
        assert wait_for(lambda: parse_exposition(scrape(url)[1])["ccld_sink_rows_total"] == sent, 60), sink.log()
        got = parse_exposition(scrape(url)[1])
        assert got["ccld_sink_files_total"] >= 1 and got["ccld_sink_write_failures_total"] == 0
    finally:
        assert sink.stop() == 0


class Hook(BaseHTTPRequestHandler):
    """A webhook that takes everything."""

    def do_POST(self) -> None:  # the name http.server calls
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_the_alert_bridges_endpoint_counts_deliveries(ccld_settings: Settings, tmp_path: Path) -> None:
    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    port = free_port()
    settings = ccld_settings.replace(alert_metrics_port=port, alert_group=f"alert-{uuid.uuid4().hex[:8]}",
                                     alert_webhook_url=f"http://127.0.0.1:{hook.server_address[1]}/hook")
    bridge = WorkerProcess(settings, tmp_path / "alert.log", command="alert", ready="alerting:").start()
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        ctype, body = scrape(url)
        assert ctype == CONTENT_TYPE
        assert parse_exposition(body)['ccld_alert_delivered_total{receiver="webhook"}'] == 0
        lint(body)
        p = Producer({"bootstrap.servers": settings.bootstrap})
        v = make_verdict(incident_id=f"inc-{uuid.uuid4().hex[:6]}")
        p.produce(settings.verdicts_topic, key=v.incident_id.encode(), value=encode_verdict(v))
        assert p.flush(20) == 0
        assert wait_for(lambda: parse_exposition(scrape(url)[1])['ccld_alert_delivered_total{receiver="webhook"}']
                        == 1, 60), bridge.log()
        assert parse_exposition(scrape(url)[1])["ccld_alert_open_incidents"] == 1
    finally:
        assert bridge.stop() == 0
        hook.shutdown()
        hook.server_close()


# --- ccld up --------------------------------------------------------------------------------------------


def test_ccld_up_prints_a_metrics_url_for_each_service_and_each_answers(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    env.update({"CCLD_TOPIC_PREFIX": f"m{tag}.", "CCLD_WORKER_APP_ID": f"up-{tag}", "CCLD_SINK_GROUP": f"sink-{tag}",
                "CCLD_ARCHIVE_DIR": str(tmp_path / "archive")})
    up = start_up(env, 0, tmp_path / "logs", merged=True)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    threading.Thread(target=lambda: [lines.put(ln) for ln in up.stdout or []], daemon=True).start()
    try:
        urls: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while len(urls) < 2 and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                line = lines.get(timeout=0.5)
                seen.append(line)
                if line.startswith("metrics: "):
                    url, _, name = line.removeprefix("metrics: ").strip().partition(" ")
                    urls[name.strip("()")] = url
        assert set(urls) == {"worker", "sink"}, "".join(seen)
        # the worker's web server starts once Faust's worker is up: give it the time a start takes
        worker_body = wait_for(lambda: _try_scrape(urls["worker"]), 60)
        assert worker_body and "ccld_worker_records_total" in worker_body, "".join(seen)
        sink_body = wait_for(lambda: _try_scrape(urls["sink"]), 30)
        assert sink_body and "ccld_sink_rows_total" in sink_body
        # the status hint names the worker's web server, and `ccld status` gets an answer from it
        with contextlib.suppress(queue.Empty):
            while not any(x.startswith("status: ") for x in seen):
                seen.append(lines.get(timeout=5))
        hint = next(x for x in seen if x.startswith("status: ")).split()
        worker = hint[hint.index("--worker") + 1]
        assert worker == urls["worker"].removesuffix("/metrics"), hint
        st = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "status", "--worker", worker], env=env,
                            capture_output=True, text=True, timeout=30)
        assert st.returncode == 0 and "no job on these workers" in st.stdout, st.stdout + st.stderr
        # and without --worker: it finds this `ccld up` (same topics) through the file ccld up wrote
        st = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "status"], env=env, capture_output=True,
                            text=True, timeout=30)
        assert st.returncode == 0 and "no job on these workers" in st.stdout, st.stdout + st.stderr
        assert f"the workers of `ccld up` (pid {up.pid}" in st.stderr and worker in st.stderr, st.stderr
    finally:
        stop_up(up)
    assert up.returncode == 0, "".join(seen)


def _try_scrape(url: str) -> str | None:
    try:
        return scrape(url)[1]
    except OSError:
        return None
