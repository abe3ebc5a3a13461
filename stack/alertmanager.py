"""A local Alertmanager for tests and benchmarks: Debian's ``prometheus-alertmanager`` on a free loopback port.

No cluster gossip, one receiver that drops everything (``"null"``): what ``ccld alert`` posts is
only kept and listed (``/api/v2/alerts``). ``tests/integration/test_alert.py`` and
``benchmarks/alert_latency.py`` both start it here. ``LocalWebhook`` is the plain webhook receiver
the bridge can post to instead (``tests/integration/test_alert.py``, ``benchmarks/soak.py``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from ccld.stack.broker import HOST, free_port

#: the binary's names: Debian's package, then upstream's
BINARIES = ("prometheus-alertmanager", "alertmanager")

# "null" quoted: a bare null is YAML's null, and Alertmanager wants a receiver name
CONFIG = 'route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n'


def alertmanager_binary() -> str | None:
    """The installed Alertmanager's path, or None (``apt-get install prometheus-alertmanager``)."""
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


class LocalAlertmanager:
    """A real Alertmanager process whose config, data and log live under ``workdir``; ``url`` once started."""

    def __init__(self, workdir: Path, binary: str | None = None) -> None:
        self.workdir = workdir
        self.binary = binary or alertmanager_binary()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    @property
    def log_path(self) -> Path:
        return self.workdir / "alertmanager.log"

    def start(self, timeout_s: float = 30.0) -> LocalAlertmanager:
        if self.binary is None:
            raise FileNotFoundError("Alertmanager is not installed: apt-get install prometheus-alertmanager")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "alertmanager.yml"
        config.write_text(CONFIG)
        port = free_port()
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [self.binary, f"--config.file={config}", f"--storage.path={self.workdir / 'data'}",
                 f"--web.listen-address={HOST}:{port}", "--cluster.listen-address="],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://{HOST}:{port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        log = self.log_path.read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"Alertmanager did not become ready in {timeout_s} s:\n{log}")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def alerts(self, incident_id: str | None = None, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """The alerts it lists (``/api/v2/alerts``; resolved ones it does not list), of one incident if given."""
        return list_alerts(self.url, incident_id, timeout_s)

    def __enter__(self) -> LocalAlertmanager:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def list_alerts(url: str, incident_id: str | None = None, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The alerts the Alertmanager at ``url`` lists (resolved ones it does not), of one incident if given."""
    query = "?" + urllib.parse.urlencode({"filter": f'incident_id="{incident_id}"'}) if incident_id else ""
    with urllib.request.urlopen(f"{url}/api/v2/alerts{query}", timeout=timeout_s) as resp:
        return list(json.loads(resp.read()))


class LocalWebhook:
    """A webhook receiver on a free loopback port (``url``) that answers each POST with the next status of
    ``script``, then ``then``, and keeps the JSON bodies it answered 2xx (``taken``) and the count of
    POSTs (``attempts``): the alert bridge's receiver, down or refusing when the script says so."""

    def __init__(self, script: Iterable[int] = (), then: int = 200) -> None:
        self.script = list(script)
        self.then = then
        self.taken: list[dict[str, Any]] = []
        self.attempts = 0
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with hook.lock:
                    hook.attempts += 1
                    status = hook.script.pop(0) if hook.script else hook.then
                    if 200 <= status < 300:
                        hook.taken.append(body)
                self.send_response(status)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per request would drown the caller's output

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> LocalWebhook:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
