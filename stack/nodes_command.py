"""``ccld nodes [--since 7d] [--json] [--archive DIR]``: which machines keep breaking jobs, and which to drain.

Reads every verdict of the window from the verdicts topic (from its beginning; the topic keeps
``verdicts_retention_ms``, 28 days by default) or, with ``--archive``, from the Parquet archive (every
day it keeps), and prints per host the incidents it was root cause of, by class and job, its decaying
score, and whether it is a drain candidate (``sinks.fleet``; the rule: the ``fleet_*`` settings).
Victim hosts (ranks that only waited) never appear. Candidates first; docs/runbook.md says what to do.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from ccld.errors import BrokerError, CcldError
from ccld.records import Verdict
from ccld.settings import Settings
from ccld.sinks.fleet import HostTracker, describe, fleet_settings, span_s


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0] if __doc__ else None
    parser.add_argument("--since", type=span_s, metavar="SPAN",
                        help="the window: 7d, 12h, 90m, ... (default: fleet_window_days, 1)")
    parser.add_argument("--archive", type=Path, metavar="DIR", help="read the verdicts from this Parquet archive "
                        "instead of the verdicts topic")
    parser.add_argument("--json", action="store_true", help="one JSON object: the rule and every host")
    parser.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS",
                        help="reading the topic: stop after this long without a new verdict (default 3)")


def _from_archive(root: Path, settings: Settings) -> Iterable[Verdict]:
    from ccld.sinks.report_model import archived_verdicts

    if not root.is_dir():
        raise CcldError(f"{root} is not a directory")
    return archived_verdicts(root, settings.verdicts_topic)


def _from_topic(settings: Settings, timeout_s: float) -> Iterable[Verdict]:
    from ccld.streams.tail import CONNECT_TIMEOUT_S, iter_verdicts

    if not settings.bootstrap:
        raise BrokerError("ccld nodes reads the verdicts topic: give --bootstrap (or CCLD_BOOTSTRAP), or --archive DIR")
    return iter_verdicts(settings, from_beginning=True, idle_timeout_s=timeout_s,
                         connect_timeout_s=CONNECT_TIMEOUT_S, broker_timeout_s=settings.verdicts_broker_timeout_s)


def main(args: argparse.Namespace, settings: Settings) -> int:
    st = fleet_settings(settings)
    window = args.since or st.window_s
    tracker = HostTracker(st)
    verdicts = _from_archive(args.archive, settings) if args.archive else _from_topic(settings, args.timeout)
    n = 0
    for v in verdicts:
        tracker.observe(v)
        n += 1
    now = time.time()
    hosts = tracker.standings(now, window_s=window)
    rule = {"min_incidents": st.min_incidents, "min_jobs": st.min_jobs, "window_s": window,
            "half_life_s": st.half_life_s, "max_hosts": st.max_hosts}
    if args.json:
        print(json.dumps({"now": now, "rule": rule, "verdicts": n, "hosts": [h.to_dict() for h in hosts]}))
        return 0
    cands = [h for h in hosts if h.candidate]
    print(f"{len(hosts)} hosts root cause of an incident in the last {_show(window)} ({n} verdicts read); "
          f"drain candidates ({st.min_incidents}+ incidents in {st.min_jobs}+ jobs): "
          f"{', '.join(h.host for h in cands) or 'none'}")
    for h in hosts:
        print(f"  {describe(h)}; last {_show(now - h.last_s)} ago")
        for inc in h.recent[:3] if h.candidate else ():
            print(f"      {inc.kind} in job {inc.job} ({_show(now - inc.first_s)} ago): {inc.evidence[:120]}")
    if not hosts:
        print("  (no incident named a host in the window)", file=sys.stderr)
    return 0


def _show(s: float) -> str:
    s = max(s, 0.0)
    for unit, size in (("d", 86_400.0), ("h", 3600.0), ("m", 60.0)):
        if s >= size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.0f} s"
