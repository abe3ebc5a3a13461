"""The pictures of ``ccld report`` as PNG bytes: the op timeline, the wait-for graph, kernel times and backlog.

Figures are built with ``matplotlib.figure.Figure`` and its Agg canvas, never ``pyplot``: no global
state, no display needed, so the report renders the same on a headless server.
"""

from __future__ import annotations

import io
from collections import defaultdict

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ccld.records import VerdictState
from ccld.sinks.report_model import Incident, rank_ranges

DONE_COLOR = "#4c72b0"
OPEN_COLOR = "#dd8452"
VERDICT_OP_COLOR = "#c44e52"
CULPRIT_BAND = "#fbe3e4"
#: at most this many affected ranks get a node of their own in the wait-for graph; more are grouped
MAX_WAITFOR_NODES = 16


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _mark_states(ax: Axes, inc: Incident, *, labels: bool) -> None:
    """The onset and each verdict's detection time as vertical lines (the first of each state labelled)."""
    ax.axvline(0.0, color="black", linestyle="--", linewidth=1.2)
    lo, hi = inc.window
    if labels:
        ax.annotate("onset", (0.0, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
                    textcoords="offset points", fontsize=9)
    seen: set[VerdictState] = set()
    for v in inc.verdicts:
        t = inc.rel(v.detected_time)
        if not lo <= t <= hi or v.state in seen:
            continue  # a verdict after the window (a close long after the job went quiet) is in the table only
        seen.add(v.state)
        ax.axvline(t, color="#555555", linestyle=":", linewidth=1.2)
        if labels:
            ax.annotate(f"{v.state.value} ({v.kind.value})", (t, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(3, -24), textcoords="offset points", fontsize=9, color="#333333")


def timeline_png(inc: Incident) -> bytes:
    """Ranks on y, seconds from the onset on x, each op a bar from its entry to its exit."""
    ranks = list(inc.ranks_shown)
    row = {r: i for i, r in enumerate(ranks)}
    fig = Figure(figsize=(11.0, 1.6 + 0.26 * max(len(ranks), 4)))
    ax = fig.add_subplot()
    culprits = set(inc.culprits)
    # A frame, not a fill: the culprit's bars must look like everyone else's to be compared with them.
    for r in culprits & set(row):
        ax.axhspan(row[r] - 0.48, row[r] + 0.48, fill=False, edgecolor=VERDICT_OP_COLOR, linewidth=1.2, zorder=4)
    groups: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for b in inc.bars:
        style = "verdict" if b.verdict_op else ("done" if b.done else "open")
        groups[(b.rank, style)].append((b.start_s, max(b.end_s - b.start_s, 0.004)))
    for (rank, style), spans in groups.items():
        color = {"verdict": VERDICT_OP_COLOR, "done": DONE_COLOR, "open": OPEN_COLOR}[style]
        ax.broken_barh(spans, (row[rank] - 0.35, 0.7), facecolors=color, edgecolor=color, linewidth=0.3,
                       hatch="///" if style == "open" else None, alpha=0.9 if style != "done" else 0.75, zorder=2)
    for idle in (False, True):
        pts = [(s.t_s, row[s.rank]) for s in inc.samples if s.idle is idle and s.rank in row]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(xs, ys, s=5 if idle else 3, marker="o" if idle else "|", color="#777777",
                       linewidths=0.5, zorder=3)
    lo, hi = inc.window
    # A culprit that fell silent (a crash, a hang outside any op: H1) shows as an empty row; say so on it.
    for r in culprits & set(row):
        last = max((s.t_s for s in inc.samples if s.rank == r), default=None)
        if last is None or last < hi - 2.0:
            at = lo if last is None else last
            ax.annotate(f"no record from rank {r} after this" if last is not None
                        else f"no record from rank {r} in this window", (at, row[r]), xytext=(6, 0),
                        textcoords="offset points", va="center", fontsize=8, color=VERDICT_OP_COLOR,
                        fontstyle="italic", zorder=5)
    ax.set_xlim(lo, hi)
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}  (culprit)" if r in culprits else f"rank {r}" for r in ranks], fontsize=8)
    for lab, r in zip(ax.get_yticklabels(), ranks, strict=True):
        if r in culprits:
            lab.set_color(VERDICT_OP_COLOR)
            lab.set_fontweight("bold")
    ax.set_xlabel("seconds from the onset (analyzer clock; each rank's clock aligned by its message timestamps)")
    _mark_states(ax, inc, labels=True)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    v = inc.current
    ax.legend(handles=[Patch(color=DONE_COLOR, alpha=0.75, label="op (entry to exit)"),
                       Patch(facecolor=OPEN_COLOR, hatch="///", label="op with no exit seen (to its last sample)"),
                       Patch(color=VERDICT_OP_COLOR, label=f"{v.op_type} #{v.op_seq}: the verdict's op"),
                       Patch(fill=False, edgecolor=VERDICT_OP_COLOR, label="culprit"),
                       Patch(color="#777777", label="grey marks: samples; dots: idle heartbeats")],
              loc="upper center", bbox_to_anchor=(0.5, -0.09 - 0.6 / (len(ranks) + 4)), ncol=3, fontsize=8,
              frameon=False)
    fig.tight_layout()
    return _png(fig)


def _groups(ranks: list[int], limit: int) -> list[list[int]]:
    """Up to ``limit`` nodes: one rank each, or consecutive chunks of ranks when there are more."""
    if len(ranks) <= limit:
        return [[r] for r in ranks]
    size = -(-len(ranks) // limit)
    return [ranks[i:i + size] for i in range(0, len(ranks), size)]


def waitfor_png(inc: Incident) -> bytes:
    """Who waits for whom: the affected ranks (left) point at the root-cause ranks (right)."""
    v = inc.current
    roots = list(v.root_cause_ranks)
    waiting = _groups(sorted(set(v.affected_ranks) - set(roots)), MAX_WAITFOR_NODES)
    n = max(len(waiting), len(roots), 1)
    fig = Figure(figsize=(7.5, 1.2 + 0.42 * n))
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_xlim(0, 10)
    ax.set_ylim(n, -1.0)

    def ys(k: int) -> list[float]:
        return [(n - k) / 2 + i for i in range(k)]  # centred on the taller column

    box = {"boxstyle": "round,pad=0.35", "linewidth": 1.0}
    ax.text(1.6, -0.8, "waiting (affected)", ha="center", fontsize=10, fontweight="bold")
    ax.text(8.2, -0.8, "waited for (root cause)", ha="center", fontsize=10, fontweight="bold")
    root_y = dict(zip(roots, ys(len(roots)), strict=True))
    for g, y in zip(waiting, ys(len(waiting)), strict=True):
        label = f"rank {g[0]}" if len(g) == 1 else f"ranks {rank_ranges(g)}"
        ax.text(1.6, y, label, ha="center", va="center", fontsize=9, bbox={**box, "facecolor": "#e8eef7"})
        for ry in root_y.values():
            ax.annotate("", xy=(7.3, ry), xytext=(2.9, y),
                        arrowprops={"arrowstyle": "->", "color": "#888888", "linewidth": 0.8})
    hosts = dict(zip(roots, v.root_cause_hosts, strict=False))
    for r, y in root_y.items():
        label = f"rank {r}" + (f"\n{hosts[r]}" if r in hosts else "")
        ax.text(8.2, y, label, ha="center", va="center", fontsize=9, color=VERDICT_OP_COLOR, fontweight="bold",
                bbox={**box, "facecolor": CULPRIT_BAND, "edgecolor": VERDICT_OP_COLOR})
    if not waiting:
        ax.text(1.6, n / 2 - 0.5, "no other rank named", ha="center", va="center", fontsize=9, color="#777777")
    if v.link is not None:
        ch = "" if v.channel is None else f", channel {v.channel}"
        if v.link.src in root_y and v.link.dst in root_y:
            # the link between two roots: an arc on their right, the data's direction
            ax.annotate("", xy=(9.0, root_y[v.link.dst]), xytext=(9.0, root_y[v.link.src]),
                        arrowprops={"arrowstyle": "->", "color": VERDICT_OP_COLOR, "linewidth": 1.4,
                                    "connectionstyle": "arc3,rad=-0.6"})
        ax.text(8.2, n - 0.2, f"slow link {v.link.src} -> {v.link.dst}{ch}", ha="center", fontsize=9,
                color=VERDICT_OP_COLOR)
    fig.tight_layout()
    return _png(fig)


def slow_png(inc: Incident) -> bytes:
    """The verdict op's kernel time per rank, and the send backlog of the verdict's communicator, over time."""
    v = inc.current
    fig = Figure(figsize=(11.0, 6.0))
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    culprits = set(v.root_cause_ranks)
    for mine in (False, True):
        pts = [(k.t_s, k.duration_s * 1e3) for k in inc.kernel_times if (k.rank in culprits) is mine]
        if pts:
            kx, ky = zip(*pts, strict=True)
            ax1.scatter(kx, ky, s=10 if mine else 6, color=VERDICT_OP_COLOR if mine else DONE_COLOR,
                        alpha=0.9 if mine else 0.45, label=f"ranks {rank_ranges(culprits)} (culprit)" if mine
                        else "other ranks of the communicator", zorder=3 if mine else 2)
    if not inc.kernel_times:
        ax1.text(0.5, 0.5, "no completed op of this communicator and type in the window", ha="center",
                 transform=ax1.transAxes, color="#777777")
    else:
        ax1.legend(fontsize=8, loc="upper left")
    ax1.set_ylabel(f"{v.op_type} time (ms)\non each rank's clock")
    ax1.set_title(f"kernel time of {v.op_type} on communicator {v.communicator}", fontsize=10)
    src = v.link.src if v.link is not None else None
    drawn = False
    by_rank: dict[int, list[tuple[float, tuple[int, ...]]]] = defaultdict(list)
    for b in inc.backlog:
        by_rank[b.rank].append((b.t_s, b.channels))
    others = False
    for rank, lags in sorted(by_rank.items()):
        xs = [t for t, _ in lags]
        if rank == src or (src is None and rank in culprits):
            chans = max(len(ch) for _, ch in lags)
            series = [[ch[c] if c < len(ch) else 0 for _, ch in lags] for c in range(chans)]
            live = [c for c in range(chans) if max(series[c]) > 0]
            # Channels with the same backlog would hide one another: one line, its channels named.
            if live and all(series[c] == series[live[0]] for c in live):
                ax2.plot(xs, series[live[0]], marker=".", linewidth=1.4, color=VERDICT_OP_COLOR,
                         label=f"rank {rank}, channel{'s' if len(live) > 1 else ''} {rank_ranges(live)}")
            else:
                for c in live:
                    mark = " (the verdict's)" if c == v.channel else ""
                    ax2.plot(xs, series[c], marker=".", linewidth=1.4 if mark else 1.0,
                             label=f"rank {rank} channel {c}{mark}")
            drawn = drawn or bool(live)
        else:
            ys = [max(ch, default=0) for _, ch in lags]
            if max(ys) > 0:
                ax2.scatter(xs, ys, s=6, color="#999999", zorder=1)
                drawn = others = True
    if drawn:
        ax2.legend(fontsize=8, loc="upper left",
                   title="grey: other ranks (largest channel)" if others else "no other rank had a backlog",
                   title_fontsize=8)
    else:
        ax2.text(0.5, 0.5, "no sample of this communicator caught a send backlog", ha="center",
                 transform=ax2.transAxes, color="#777777")
    ax2.set_ylabel("send backlog\n(RecvCount - SendCount)")
    ax2.set_title("send backlog per channel, from samples taken inside an op", fontsize=10)
    ax2.set_xlabel("seconds from the onset (analyzer clock)")
    lo, hi = inc.window
    ax2.set_xlim(lo, hi)
    for ax in (ax1, ax2):
        _mark_states(ax, inc, labels=ax is ax1)
        ax.grid(color="#eeeeee", linewidth=0.6)
    fig.tight_layout()
    return _png(fig)
