"""``ccld status [--job J] [--json] [--worker URL ...]``: a job's live status from the workers that hold it.

Asks every worker's ``/status/`` page (each serves the jobs of its partitions; a job spread over
several workers is merged), then prints the ranks grouped by what they do, who waits for whom, the
open incidents and the communicators, stalled first. Without ``--job``: the jobs the workers hold.
Workers: ``--worker`` (repeatable), else ``CCLD_STATUS_WORKERS`` (comma-separated URLs), else the workers of
a ``ccld up`` running on this machine for the same topics (``ccld.up_state``; which one is said on stderr),
else the worker web port of these settings on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
import urllib.request
from typing import Any

from ccld.settings import Settings
from ccld.streams.status import merge, render


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0] if __doc__ else None
    parser.add_argument("--worker", action="append", default=[], metavar="URL",
                        help="a worker's web address, e.g. http://127.0.0.1:6066 (repeatable)")
    parser.add_argument("--json", action="store_true", help="the merged status as one JSON object")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="per worker (default 2)")


def worker_urls(args: argparse.Namespace, settings: Settings) -> list[str]:
    if args.worker:
        return list(args.worker)
    if settings.status_workers:
        return [u.strip() for u in settings.status_workers.split(",") if u.strip()]
    from ccld.up_state import running

    ups = running(settings.topic_prefix, settings.bootstrap)
    if ups:
        for up in ups:
            print(f"ccld status: asking the workers of `ccld up` (pid {up.pid}, broker {up.bootstrap}): "
                  f"{', '.join(up.workers)}", file=sys.stderr)
        return [w for up in ups for w in up.workers]
    return [f"http://127.0.0.1:{settings.worker_web_port or 6066}"]


def fetch(url: str, job: str | None, timeout_s: float) -> dict[str, Any]:
    query = "" if job is None else "?" + urllib.parse.urlencode({"job": job})
    with urllib.request.urlopen(f"{url.rstrip('/')}/status/{query}", timeout=timeout_s) as resp:
        body: dict[str, Any] = json.loads(resp.read())
        return body


def main(args: argparse.Namespace, settings: Settings) -> int:
    # the flag only: CCLD_JOB is what producers stamp, and every job name defaults to "default"
    job = getattr(args, "job", None) or None
    answers: list[dict[str, Any]] = []
    failed: list[str] = []
    for url in worker_urls(args, settings):
        try:
            answers.append(fetch(url, job, args.timeout_s))
        except (OSError, ValueError) as exc:  # refused, timed out, not JSON: that worker is not reachable
            failed.append(f"{url} ({exc})")
    if not answers:
        print(f"ccld status: no worker answered: {'; '.join(failed)} (is the worker's web port on? `ccld worker "
              f"--web-port 6066`, or `ccld up`, which turns it on; other workers: --worker URL)", file=sys.stderr)
        return 2
    for f in failed:
        print(f"ccld status: not answering: {f}; its partitions are missing below", file=sys.stderr)
    if job is None:
        jobs = sorted({j["job"] for a in answers for j in a.get("jobs", [])})
        print(json.dumps({"jobs": jobs}) if args.json else
              ("jobs: " + ", ".join(jobs) if jobs else "no job on these workers") + " (ccld status --job J)")
        return 0
    status = merge([a for a in answers if a.get("incarnation") is not None]) or {"job": job, "comms": []}
    print(json.dumps(status) if args.json else render(status))
    return 0 if status.get("incarnation") is not None else 1
