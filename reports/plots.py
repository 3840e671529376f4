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
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
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
    for x, y, row in zip(xs, ys, usable, strict=True):
        ax.annotate(plain(row.label[:40]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("tokens/s (higher is better)" if axis == "speed" else "J/token (lower is better)")
    ax.set_ylabel(plain(usable[0].task.primary_metric or "quality"))
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


def _png(fig) -> str:
    """A finished figure as a base64 PNG, the figure closed."""
    import matplotlib.pyplot as plt

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
