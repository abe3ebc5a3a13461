"""The HTML page of ``ccld report``: one self-contained string (inline CSS, images as base64 PNG, no script).

Pure: an ``Incident`` and the PNG bytes in, the page out, so tests read it without a browser.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
from collections.abc import Mapping

from ccld.anomaly import Family
from ccld.records import Verdict
from ccld.sinks.report_model import Incident, alignment_note, rank_ranges

#: an analyzer time below this is not a Unix time (the simulator's clock starts at 0): shown as seconds
_EPOCH_MIN_S = 1e9

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1140px;
color:#222;line-height:1.45;padding:0 12px}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:0}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em}td,th{border:1px solid #ddd;padding:4px 8px;
vertical-align:top;text-align:left}th{background:#f5f5f5}
.kv th{width:13em}.culprit{color:#c44e52;font-weight:bold}
.action{background:#fff6e0;border-left:4px solid #e0a800;padding:8px 12px}
.note{color:#555;font-size:.9em}img{max-width:100%;border:1px solid #eee}
.state-open{color:#c44e52;font-weight:bold}.state-update{color:#dd8452;font-weight:bold}
.state-resolved{color:#2e7d32;font-weight:bold}.state-closed{color:#555;font-weight:bold}
code{background:#f3f3f3;padding:0 3px}
"""


def fmt_time(t: float) -> str:
    """An analyzer-clock time: UTC when it is a Unix time, else seconds on the (simulated) clock."""
    if t < _EPOCH_MIN_S:
        return f"t = {t:.1f} s (simulated clock)"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-5] + " UTC"


def e(x: object) -> str:
    return html.escape(str(x))


def img(png: bytes, alt: str) -> str:
    return f'<img alt="{e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _where(v: Verdict) -> str:
    ranks = ", ".join(f"rank {r}" for r in v.root_cause_ranks) or "not localized"
    hosts = f" on {', '.join(v.root_cause_hosts)}" if v.root_cause_hosts else ""
    return f'<span class="culprit">{e(ranks)}</span>{e(hosts)}'


def headline(v: Verdict) -> str:
    """What the verdict names, shortest: the link for a class that names one, else the ranks."""
    if v.link is not None:
        ch = "" if v.channel is None else f", channel {v.channel}"
        return f"link {v.link.src} -> {v.link.dst}{ch}"
    return ", ".join(f"rank {r}" for r in v.root_cause_ranks) or "root not localized"


def _summary(inc: Incident) -> str:
    v, info = inc.current, inc.info
    rows = [
        ("class", f"{e(v.kind.value)}: {e(info.title)} ({e(info.family.value)})"),
        ("root cause", _where(v)),
        ("how the root is named", e(info.root)),
        ("op", f"{e(v.op_type)} #{v.op_seq} of communicator <code>{e(v.communicator)}</code>"),
        ("affected ranks", f"{len(v.affected_ranks)}: {e(rank_ranges(v.affected_ranks))}"),
    ]
    if v.link is not None:
        ch = "" if v.channel is None else f", channel {v.channel}"
        rows.append(("link", e(f"{v.link.src} -> {v.link.dst}{ch}")))
    if v.p is not None:
        rows.append(("slow ratio P", e(f"{v.p:.2f} (about 1: a late arriver; about 0: the communication itself)")))
    if v.mismatch_field:
        rows.append(("differs in", e(v.mismatch_field)))
    rows += [("confidence", f"{v.confidence:.2f}"), ("onset", e(fmt_time(inc.onset))),
             ("first verdict", e(fmt_time(min(x.detected_time for x in inc.verdicts)))),
             ("job", e(v.job))]
    body = "".join(f"<tr><th>{k}</th><td>{val}</td></tr>" for k, val in rows)
    return f'<table class="kv">{body}</table>'


def _states(inc: Incident) -> str:
    head = "<tr><th>state</th><th>time</th><th>class</th><th>root cause</th><th>P</th><th>evidence</th></tr>"
    rows = []
    for v in inc.verdicts:
        extra = "".join(f"<br><span class='note'>{e(k)}: {e(val)}</span>" for k, val in sorted(v.details.items()))
        p = "" if v.p is None else f"{v.p:.2f}"
        rows.append(f'<tr><td class="state-{v.state.value}">{e(v.state.value)}</td>'
                    f"<td>{e(fmt_time(v.detected_time))}</td><td>{e(v.kind.value)}</td><td>{_where(v)}</td>"
                    f"<td>{p}</td><td>{e(v.evidence)}{extra}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _ranks_note(inc: Incident) -> str:
    shown = f"{len(inc.ranks_shown)} ranks shown ({e(rank_ranges(inc.ranks_shown))})"
    if not inc.ranks_hidden:
        return f'<p class="note">{shown}.</p>'
    hidden = set(inc.ranks_hidden)
    affected = len(hidden & set(inc.current.affected_ranks))
    return (f'<p class="note">{shown}: the culprits, the affected ranks and the verdict\'s communicator first. '
            f"{len(hidden)} more ranks are not drawn ({e(rank_ranges(inc.ranks_hidden))}), {affected} of them "
            "affected.</p>")


def build_html(inc: Incident, images: Mapping[str, bytes], *, archive: str) -> str:
    """The page. ``images``: ``timeline``, ``waitfor`` and, for slow classes, ``slow`` (PNG bytes)."""
    v, info = inc.current, inc.info
    title = f"{v.kind.value} {info.title}: {headline(v)}"
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>CCL-D incident {e(inc.incident_id)}: {e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        f'<p class="sub">CCL-D incident <code>{e(inc.incident_id)}</code>, job <code>{e(v.job)}</code>; '
        f"{len(inc.verdicts)} verdict{'s' if len(inc.verdicts) != 1 else ''}, now "
        f'<span class="state-{inc.verdicts[-1].state.value}">{e(inc.verdicts[-1].state.value)}</span></p>',
        f"<h2>Verdict</h2><p>{e(v.evidence)}</p>{_summary(inc)}",
        f'<h2>What to check next</h2><p class="action">{e(info.action)}</p>',
        f"<h2>Every state of the incident</h2>{_states(inc)}",
        "<h2>Op timeline around the onset</h2>",
    ]
    if inc.bars or inc.samples:
        parts += [f'<p class="note">{e(alignment_note())}</p>', _ranks_note(inc), img(images["timeline"], "timeline")]
    else:
        parts.append('<p class="note">The archive holds no metrics of this job around the onset '
                     "(the sink was not running, or the files were removed).</p>")
    parts += ["<h2>Who waits for whom</h2>",
              '<p class="note">Each affected rank waits, directly or through other communicators, for the '
              "root-cause ranks.</p>", img(images["waitfor"], "wait-for graph")]
    if info.family is Family.SLOW or v.link is not None:
        parts.append("<h2>Slowdown: kernel time and send backlog</h2>")
        ps = ", ".join(f"{x.state.value} {x.p:.2f}" for x in inc.verdicts if x.p is not None)
        parts.append(f'<p class="note">P (the slow ratio) per verdict: {e(ps or "not given")}. P comes from '
                     "the spread of arrivals against the op's time: near 1 a late arriver (comp-slow), near 0 "
                     "the communication itself (comm-slow). Backlog is what the analyzer reads from samples "
                     "taken inside an op; the per-kernel peaks DONE records carry are not archived.</p>")
        if "slow" in images:
            parts.append(img(images["slow"], "kernel time and backlog"))
    parts.append(f'<p class="note">Made by <code>ccld report</code> from the archive <code>{e(archive)}</code>: '
                 f"{inc.metric_rows:,} metric rows of the job between {inc.window[0]:.0f} s and "
                 f"{inc.window[1]:.0f} s around the onset.</p></body></html>")
    return "\n".join(parts)
