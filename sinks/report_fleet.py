"""``ccld report --fleet``: the cluster's view as one self-contained HTML page (hosts x time, incidents by class).

Pure apart from matplotlib's Agg canvas: the fleet tracker's standings (``sinks.fleet``) in, the page out.
The picture puts each host root cause of an incident in the window on a row (drain candidates first, marked),
time on x, and each incident as a marker coloured by its class, so a machine that keeps failing the same way
reads as a row of one colour, and faults that strike at random as scattered dots.
"""

from __future__ import annotations

import datetime as dt
import io

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ccld.sinks.fleet import FleetSettings, HostStanding, HostTracker, drain_action
from ccld.sinks.report_html import CSS, e, fmt_time, img

#: one colour per class: hangs in warm colours, slowdowns in cool ones
KIND_COLORS = {"H1": "#c44e52", "H2": "#8c2d9c", "H3": "#dd8452", "S1": "#4c72b0", "S2": "#55a868", "S3": "#64b5cd"}
#: hosts drawn at most (candidates first, then by score); the table lists them all
MAX_ROWS = 40


def fleet_png(tracker: HostTracker, hosts: list[HostStanding], start_s: float, now_s: float) -> bytes:
    shown = hosts[:MAX_ROWS]
    fig = Figure(figsize=(11.0, 1.8 + 0.28 * max(len(shown), 4)))
    ax = fig.add_subplot()
    row = {h.host: i for i, h in enumerate(reversed(shown))}  # the first host on top
    # the axis starts an hour before the first incident drawn, not at the window's start (a week, mostly empty)
    firsts = [h.first_s for h in shown]
    start_s = max(start_s, min(firsts) - 3600.0) if firsts else start_s
    hours = (now_s - start_s) / 3600.0
    for inc in tracker.incidents.values():
        if inc.first_s < start_s:
            continue
        x = (inc.first_s - start_s) / 3600.0
        for name in dict.fromkeys(inc.hosts):
            if name in row:
                ax.scatter([x], [row[name]], s=60, color=KIND_COLORS.get(inc.kind, "#777777"), edgecolors="black",
                           linewidths=0.4, zorder=3)
    for h in shown:
        if h.candidate:
            ax.axhspan(row[h.host] - 0.45, row[h.host] + 0.45, color="#fbe3e4", zorder=1)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([f"{h.host}{'  (drain)' if h.candidate else ''}" for h in reversed(shown)], fontsize=9)
    ax.set_xlim(0.0, max(hours, 1e-3))
    ax.set_ylim(-0.7, max(len(shown), 1) - 0.3)
    ax.set_xlabel(f"hours since {dt.datetime.fromtimestamp(start_s, dt.UTC):%Y-%m-%d %H:%M} UTC")
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    ax.legend(handles=[Line2D([], [], marker="o", linestyle="", color=c, markeredgecolor="black", label=k)
                       for k, c in KIND_COLORS.items()], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9,
              title="class")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def fleet_html(tracker: HostTracker, hosts: list[HostStanding], png: bytes, *, start_s: float, now_s: float,
               source: str) -> str:
    st: FleetSettings = tracker.settings
    cands = [h for h in hosts if h.candidate]
    title = f"Fleet: {len(cands)} drain candidate{'s' if len(cands) != 1 else ''} among {len(hosts)} hosts"
    rows = []
    for h in hosts:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(h.by_kind.items()))
        verdict = f'<span class="culprit">drain ({e(h.part)})</span>' if h.candidate else "watch"
        action = f'<br><span class="note">{e(drain_action(h))}</span>' if h.candidate else ""
        recent = "<br>".join(f"{e(i.kind)} in job <code>{e(i.job)}</code>, {e(fmt_time(i.first_s))}"
                             for i in h.recent[:3])
        rows.append(f"<tr><td><b>{e(h.host)}</b></td><td>{verdict}{action}</td><td>{h.incidents}"
                    f"{f' (+{h.spread})' if h.spread else ''}</td><td>{h.jobs}</td><td>{e(kinds)}</td>"
                    f"<td>{h.score:.2f}</td><td>{recent}</td></tr>")
    head = ("<tr><th>host</th><th>standing</th><th>incidents</th><th>jobs</th><th>classes</th><th>score</th>"
            "<th>newest</th></tr>")
    rule = (f"a host is a drain candidate when one part of it (its GPUs: S1, H1, S3; its network: S2, H3, S3; its "
            f"software: H2) was root cause in at least {st.min_incidents} incidents of at least {st.min_jobs} "
            f"jobs within the window; each incident counts 1 in the score, halved every "
            f"{st.half_life_s / 3600:.0f} h. Hosts of ranks that only waited are never counted.")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>CCL-D {e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="sub">Incidents from {e(fmt_time(start_s))} to {e(fmt_time(now_s))}; {e(rule)}</p>',
        "<h2>Hosts and their incidents over time</h2>",
        '<p class="note">One row per host root cause of an incident in the window (drain candidates first, '
        f"shaded; at most {MAX_ROWS} drawn), one dot per incident, coloured by class.</p>",
        img(png, "hosts by time, incidents coloured by class"),
        f"<h2>Every host</h2><table>{head}{''.join(rows)}</table>",
        '<h2>What to do with a candidate</h2><p class="action">Drain it, check the part its incidents point '
        "at, put it back when the checks pass (docs/runbook.md, \"Drain candidates\").</p>",
        f'<p class="note">Made by <code>ccld report --fleet</code> from {e(source)}.</p></body></html>',
    ]
    return "\n".join(parts)
