"""Quality against tokens/s and against J/token, with the Pareto front marked (matplotlib)."""

from __future__ import annotations

import base64
import io

from decodebench.reports.tables import Row


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
    xerr = [
        _span(r.measurement.get("tokens_per_second_interval"), value(r)) if axis == "speed" else (0, 0) for r in usable
    ]
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
        ax.annotate(row.label[:40], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("tokens/s (higher is better)" if axis == "speed" else "J/token (lower is better)")
    ax.set_ylabel(usable[0].task.primary_metric or "quality")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
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


def task_plots(rows: list[Row]) -> dict[str, str | None]:
    return {"speed": _scatter(rows, "speed"), "energy": _scatter(rows, "energy")}
