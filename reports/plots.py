"""Quality against tokens/s and against J/token, with the Pareto front marked (matplotlib)."""

from __future__ import annotations

import base64
import io

from decodebench.reports.tables import Row, speed_interval


def plain(text: str) -> str:
    """Text for matplotlib as it is: a ``$`` would start its TeX math, and a label that is bad TeX (labels come from
    whoever wrote the results) fails the whole figure."""
    return str(text).replace("$", r"\$")


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (both maximized)."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((ox >= x and oy >= y) and (ox > x or oy > y) for j, (ox, oy) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return front


def _scatter(rows: list[Row], axis: str) -> str | None:
    """A PNG (base64) of quality against tokens/s (``axis="speed"``) or J/token (``"energy"``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    value = (lambda r: r.tokens_per_second) if axis == "speed" else (lambda r: r.joules_per_token)
    usable = [r for r in rows if r.quality is not None and value(r) is not None]
    if not usable:
        return None
    xs = [value(r) for r in usable]
    ys = [r.quality for r in usable]
    # error bars: the quality interval, and the tokens/s interval on the speed plot
    yerr = [_span(r.metrics[r.task.primary_metric].interval, r.quality) for r in usable]
    xerr = [_span(speed_interval(r), value(r)) if axis == "speed" else (0, 0) for r in usable]
    # fewer joules per token is better: the front maximizes -J/token
    front = pareto_front([(x if axis == "speed" else -x, y) for x, y in zip(xs, ys, strict=True)])
    fig, ax = plt.subplots(figsize=(9.6, 4.2), dpi=110)  # the right third: the key of the numbered points
    ax.errorbar(
        xs,
        ys,
        yerr=list(zip(*yerr, strict=True)),
        xerr=list(zip(*xerr, strict=True)),
        fmt="none",
        ecolor="#cbd2d9",
        zorder=1,
    )
    ax.scatter(xs, ys, color="#9aa5b1", zorder=2)
    ordered = sorted(front, key=lambda i: xs[i])
    ax.plot(
        [xs[i] for i in ordered], [ys[i] for i in ordered], color="#d9480f", marker="o", zorder=3, label="Pareto front"
    )
    ax.set_xlabel("tokens/s (higher is better)" if axis == "speed" else "J/token (lower is better)")
    ax.set_ylabel(plain(usable[0].task.primary_metric or "quality"))
    ax.grid(alpha=0.3)
    number_points(ax, xs, ys, [row.label for row in usable])
    return _png(fig, laid_out=True)


# where a point's label may go (points from the point: right and up first, then around it)
LABEL_OFFSETS = ((4, 4), (4, -10), (-12, 4), (-12, -10), (4, 14), (4, -20), (-12, 14), (-12, -20))


def label_groups(points: list[tuple[float, float]], radius: float) -> list[list[int]]:
    """Indices of points (in display units) grouped so that no two groups' first points lie within ``radius`` of
    each other: the points one label serves (methods that land on one spot, as equal runs do)."""
    groups: list[list[int]] = []
    for i, (x, y) in enumerate(points):
        near = next(
            (g for g in groups if abs(points[g[0]][0] - x) < radius and abs(points[g[0]][1] - y) < radius), None
        )
        if near is None:
            groups.append([i])
        else:
            near.append(i)
    return groups


def number_points(ax, xs: list[float], ys: list[float], labels: list[str]) -> None:
    """Each point numbered on the plot (points on one spot share a label, "1,3") and named in a key beside the axes,
    so that long run labels never print over each other."""
    from matplotlib.lines import Line2D

    key = [Line2D([], [], linestyle="none", label=plain(f"{i + 1}: {label[:60]}")) for i, label in enumerate(labels)]
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + key, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    ax.figure.tight_layout()  # the axes' final place and limits first: labels are placed in display units
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    shown = ax.transData.transform(list(zip(xs, ys, strict=True)))
    placed = []  # the label boxes drawn so far: a label takes the first place beside its point that none covers
    for group in label_groups([tuple(p) for p in shown], radius=9.0):
        text = ",".join(str(i + 1) for i in group)
        for offset in LABEL_OFFSETS:
            label = ax.annotate(
                text, (xs[group[0]], ys[group[0]]), textcoords="offset points", xytext=offset, fontsize=7
            )
            box = label.get_window_extent(renderer).padded(3)  # a gap, so that "12" and "11" never read "1211"
            if not any(box.overlaps(other) for other in placed) or offset == LABEL_OFFSETS[-1]:
                placed.append(box)
                break
            label.remove()


def _png(fig, laid_out: bool = False) -> str:
    """A finished figure as a base64 PNG, the figure closed (laid out first unless it was, as labels placed in
    display units need)."""
    import matplotlib.pyplot as plt

    if not laid_out:
        fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _span(interval, value) -> tuple[float, float]:
    """Distances below and above ``value`` of its interval (0, 0 without one)."""
    if not interval:
        return 0.0, 0.0
    return max(0.0, value - interval[0]), max(0.0, interval[1] - value)


def concurrency_plot(rows: list[Row]) -> str | None:
    """For served runs: throughput (tokens/s) against p90 TPOT and against p90 TTFT, one line per method across the
    numbers of requests in flight, each point labelled with its concurrency and quality (a PNG, base64)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    served = [r for r in rows if r.run.concurrency and r.tokens_per_second is not None]
    lines: dict[str, list[Row]] = {}
    for row in served:
        lines.setdefault(row.run.label, []).append(row)
    if not any(len(points) > 1 for points in lines.values()):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110, sharey=True)
    for ax, key, name in ((axes[0], "tpot_s", "p90 TPOT (ms)"), (axes[1], "ttft_s", "p90 TTFT (ms)")):
        for label, points in lines.items():
            points = sorted(points, key=lambda r: r.run.concurrency)
            xs = [1000 * ((r.measurement.get(key) or {}).get("p90") or float("nan")) for r in points]
            ys = [r.tokens_per_second for r in points]
            ax.plot(xs, ys, marker="o", label=plain(label[:40]))
            for x, y, row in zip(xs, ys, points, strict=True):
                quality = f", {row.quality:.2f}" if row.quality is not None else ""
                text = f"c={row.run.concurrency}{quality}"
                ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel(f"{name} (lower is better)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens/s (higher is better)")
    axes[0].legend(loc="best", fontsize=7)
    return _png(fig)


def load_plot(rows: list[Row]) -> str | None:
    """For open-loop served runs: goodput (requests/s within the SLO; where runs had one) and quality against the
    offered request rate, one line per method, quality with its 95% interval (a PNG, base64)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[str, list[Row]] = {}
    for row in rows:
        if row.run.request_rate is not None:
            lines.setdefault(row.run.label, []).append(row)
    if not any(len(points) > 1 for points in lines.values()):
        return None
    fig, (goodput_ax, quality_ax) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110, sharex=True)
    for label, points in lines.items():
        points = sorted(points, key=offered_load)
        rates = [offered_load(r) for r in points]
        goodput = [((r.measurement.get("slo") or {}).get("goodput_rps") or float("nan")) for r in points]
        (line,) = goodput_ax.plot(rates, goodput, marker="o", label=plain(label[:40]))
        quality = [r.quality if r.quality is not None else float("nan") for r in points]
        spans = [_span(r.metrics[r.task.primary_metric].interval, r.quality) if r.quality is not None else (0, 0)
                 for r in points]  # fmt: skip
        quality_ax.errorbar(
            rates, quality, yerr=list(zip(*spans, strict=True)), marker="o", capsize=3, color=line.get_color()
        )
    offered = [offered_load(r) for points in lines.values() for r in points]
    low, high = min(offered), max(offered)  # every request within the SLO: goodput equals the offered rate
    goodput_ax.plot([low, high], [low, high], color="#9aa5b1", linestyle="--", label="offered rate")
    goodput_ax.set_ylabel("goodput: requests/s within the SLO")
    quality_ax.set_ylabel(plain(points[0].task.primary_metric or "quality"))
    for ax in (goodput_ax, quality_ax):
        ax.set_xlabel("offered load (requests/s)")
        ax.grid(alpha=0.3)
    goodput_ax.legend(loc="best", fontsize=7)
    return _png(fig)


def offered_load(row: Row) -> float:
    """An open-loop run's offered requests/s; for one that sent every request at once (a sweep's throughput end, at
    the open loop's highest rate), the requests/s it was answered at, where the server set the pace."""
    from decodebench.models.backends.served_load import MAX_REQUEST_RATE

    rate = row.run.request_rate
    measured = row.measurement or {}
    if rate >= MAX_REQUEST_RATE and measured.get("requests") and measured.get("generate_seconds"):
        return measured["requests"] / measured["generate_seconds"]
    return rate


def task_plots(rows: list[Row]) -> dict[str, str | None]:
    return {
        "speed": _scatter(rows, "speed"),
        "energy": _scatter(rows, "energy"),
        "concurrency": concurrency_plot(rows),
        "load": load_plot(rows),
    }
