"""`ccld report INCIDENT_ID [--archive DIR] [--out FILE]`: one self-contained HTML page per incident;
`ccld report --fleet [--since SPAN]`: the cluster's view, hosts by time with their incidents (``report_fleet``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ccld.anomaly import Family
from ccld.errors import CcldError
from ccld.settings import Settings
from ccld.sinks.fleet import span_s
from ccld.sinks.report_html import build_html
from ccld.sinks.report_model import load_incident


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("incident_id", nargs="?", help="the incident's id (ccld verdicts shows it as [incident ...])")
    parser.add_argument("--fleet", action="store_true", help="the cluster's view instead: every host root cause of "
                        "an incident, by time and class, and the drain candidates (ccld nodes)")
    parser.add_argument("--since", type=span_s, metavar="SPAN",
                        help="--fleet: the window (default: fleet_window_days)")
    parser.add_argument("--archive", type=Path, help="the sink's archive folder (default: archive_dir setting)")
    parser.add_argument("--out", type=Path,
                        help="where the page goes (default: report-<incident id>.html, report-fleet.html)")


def _write(page: str, out: Path) -> None:
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)  # a reader (a browser reloading) never sees half a page


def fleet(root: Path, settings: Settings, since_s: float | None, out: Path) -> str:
    """The fleet page from the archive's verdicts; the line to print."""
    import time

    from ccld.sinks.fleet import HostTracker, fleet_settings
    from ccld.sinks.report_fleet import fleet_html, fleet_png
    from ccld.sinks.report_model import archived_verdicts

    if not root.is_dir():
        raise CcldError(f"{root} is not a directory")
    tracker = HostTracker(fleet_settings(settings))
    tracker.observe_all(archived_verdicts(root, settings.verdicts_topic))
    now = time.time()
    window = since_s or tracker.settings.window_s
    hosts = tracker.standings(now, window_s=window)
    page = fleet_html(tracker, hosts, fleet_png(tracker, hosts, now - window, now), start_s=now - window, now_s=now,
                      source=f"the archive {root.resolve()}")
    _write(page, out)
    cands = [h.host for h in hosts if h.candidate]
    return f"{out}: {len(hosts)} hosts root cause of an incident, drain candidates: {', '.join(cands) or 'none'}"


def main(args: argparse.Namespace, settings: Settings) -> int:
    root = args.archive if args.archive is not None else Path(settings.archive_dir)
    if args.fleet:
        print(fleet(root, settings, args.since, args.out or Path("report-fleet.html")))
        return 0
    if not args.incident_id:
        raise CcldError("ccld report needs an INCIDENT_ID (ccld verdicts shows them), or --fleet")
    inc = load_incident(root, args.incident_id, verdicts_topic=settings.verdicts_topic,
                        metrics_topic=settings.metrics_topic)
    # matplotlib is imported only once the incident is found: an unknown id answers at once
    from ccld.sinks.report_plots import slow_png, timeline_png, waitfor_png

    images = {"timeline": timeline_png(inc), "waitfor": waitfor_png(inc)}
    if inc.info.family is Family.SLOW or inc.current.link is not None:
        images["slow"] = slow_png(inc)
    page = build_html(inc, images, archive=str(root.resolve()))
    out: Path = args.out if args.out is not None else Path(f"report-{args.incident_id}.html")
    _write(page, out)
    v = inc.current
    print(f"{out}: {v.kind.value} {inc.info.title}, incident {inc.incident_id}, {len(inc.verdicts)} verdicts, "
          f"{len(inc.ranks_shown)} ranks drawn")
    return 0
