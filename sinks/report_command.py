"""`ccld report INCIDENT_ID [--archive DIR] [--out FILE]`: one self-contained HTML page per incident."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ccld.anomaly import Family
from ccld.settings import Settings
from ccld.sinks.report_html import build_html
from ccld.sinks.report_model import load_incident


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("incident_id", help="the incident's id (ccld verdicts shows it as [incident ...])")
    parser.add_argument("--archive", type=Path, help="the sink's archive folder (default: archive_dir setting)")
    parser.add_argument("--out", type=Path, help="where the page goes (default: report-<incident id>.html)")


def main(args: argparse.Namespace, settings: Settings) -> int:
    root = args.archive if args.archive is not None else Path(settings.archive_dir)
    inc = load_incident(root, args.incident_id, verdicts_topic=settings.verdicts_topic,
                        metrics_topic=settings.metrics_topic)
    # matplotlib is imported only once the incident is found: an unknown id answers at once
    from ccld.sinks.report_plots import slow_png, timeline_png, waitfor_png

    images = {"timeline": timeline_png(inc), "waitfor": waitfor_png(inc)}
    if inc.info.family is Family.SLOW or inc.current.link is not None:
        images["slow"] = slow_png(inc)
    page = build_html(inc, images, archive=str(root.resolve()))
    out: Path = args.out if args.out is not None else Path(f"report-{args.incident_id}.html")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)  # a reader (a browser reloading) never sees half a page
    v = inc.current
    print(f"{out}: {v.kind.value} {inc.info.title}, incident {inc.incident_id}, {len(inc.verdicts)} verdicts, "
          f"{len(inc.ranks_shown)} ranks drawn")
    return 0
