"""``decodebench report RESULTS... --out DIR``: Markdown, HTML, CSV and JSON leaderboards.

All four files are rendered in memory first, written beside their final names and then renamed
into place, so a report killed while it works leaves the previous report whole.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from decodebench.reports.plots import task_plots
from decodebench.reports.reader import read_runs
from decodebench.reports.tables import (
    SMALL_N,
    Row,
    build_rows,
    comparison_text,
    csv_text,
    energy_text,
    interval_text,
    json_text,
    machine_name,
    markdown,
    memory_text,
    metric_names,
    p_text,
    percentiles_text,
    ratio_text,
    speed_text,
    speed_title,
)


def _cell(text: str, sort=None, title: str = "", css: str = "") -> dict:
    sort_key = "" if sort is None else f"{sort:.12g}" if isinstance(sort, (int, float)) else str(sort)
    return {"text": text, "sort": sort_key, "title": title, "class": css}


def _html_rows(rows: list[Row], metrics: list[str], primary: str | None) -> list[dict]:
    best = max((r.quality for r in rows if r.quality is not None), default=None)
    out = []
    for row in rows:
        m = row.measurement
        cells = []
        for metric in metrics:
            cell = row.metrics.get(metric)
            if cell is None:
                cells.append(_cell("-"))
                continue
            title = f"95% interval ({cell.interval_method})" if cell.interval else (cell.interval_method or "")
            cells.append(_cell(interval_text(cell), cell.value, title))
        primary_cell = row.metrics.get(primary) if primary else None
        comparison = primary_cell.comparison if primary_cell else None
        if comparison:
            delta = _cell(
                comparison_text(primary_cell),
                comparison["difference"],
                f"{comparison['test']} on {comparison['n']} paired documents, {p_text(comparison)}",
                "significant" if primary_cell.significant else "",
            )
        else:
            delta = _cell("no matching baseline" if row.baseline_note else "-", None, row.baseline_note or "")
        energy_title = row.energy_note or "J per output token / per prompt+output token"
        out.append(
            {
                "label": row.label,
                "best": best is not None and row.quality == best,
                "n": _cell(
                    str(row.n) if row.n is not None else "-",
                    row.n,
                    "fewer than 10 documents: intervals are approximate"
                    if row.approximate
                    else (f"fewer than {SMALL_N} documents: intervals are wide" if row.small_n else ""),
                    "small-n" if row.small_n else "",
                ),
                "metrics": cells,
                "delta": delta,
                "speed": _cell(speed_text(row), row.tokens_per_second, speed_title(row)),
                "ratio": _cell(
                    ratio_text(row),
                    row.speed_ratio,
                    f"two runs taken at different times, against {row.baseline.path}: for a speed claim, "
                    "`decodebench compare` runs both in interleaved rounds"
                    if row.baseline
                    else (row.baseline_note or ""),
                ),
                "latency": _cell(percentiles_text(m.get("latency_s")), (m.get("latency_s") or {}).get("p50")),
                "ttft": _cell(percentiles_text(m.get("ttft_s")), (m.get("ttft_s") or {}).get("p50")),
                "tpot": _cell(percentiles_text(m.get("tpot_s"), 1000, 1), (m.get("tpot_s") or {}).get("p50")),
                "memory": _cell(memory_text(row), m.get("peak_memory_bytes"), m.get("memory_source") or ""),
                "energy": _cell(energy_text(row), row.joules_per_token, energy_title),
                "loops": _cell(
                    f"{m['degenerate_rate']:.2f}" if m.get("degenerate_rate") is not None else "-",
                    m.get("degenerate_rate"),
                ),
                "method": row.method_summary,
                "machine": machine_name(row.run),
                "notes": row.notes,
            }
        )
    return out


def html(by_task: dict[str, list[Row]], runs, problems: list[str]) -> str:
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=jinja2.select_autoescape(["html", "j2"])
    )
    tasks = []
    for name, rows in by_task.items():
        metrics = metric_names(rows)
        primary = rows[0].task.primary_metric if rows else None
        notes = [row.energy_note for row in rows if row.energy_note]
        tasks.append(
            {
                "name": name,
                "primary": primary,
                "metrics": metrics,
                "rows": _html_rows(rows, metrics, primary),
                "plots": task_plots(rows),
                "energy_note": notes[0] if notes else None,
                "small_n": any(row.small_n for row in rows),
            }
        )
    return environment.get_template("leaderboard.html.j2").render(
        runs=runs,
        tasks=tasks,
        small_n=SMALL_N,
        machines=sorted({machine_name(run) for run in runs}),
        revisions=sorted({run.git_hash for run in runs if run.git_hash}),
        models=sorted({run.pretrained for run in runs}),
        written=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        problems=problems + [f"{run.path}: {p}" for run in runs for p in run.problems],
    )


def write_atomically(files: dict[Path, str]) -> list[Path]:
    """Write every file beside its final name, then rename each into place (all renders done first)."""
    staged = []
    try:
        for path, text in files.items():
            fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            staged.append((temp, path))
    except BaseException:
        for temp, _ in staged:
            Path(temp).unlink(missing_ok=True)
        raise
    for temp, path in staged:
        os.replace(temp, path)
    return [path for _, path in staged]


def write_report(paths: list[str | Path], out: str | Path) -> tuple[list[Path], list[str]]:
    """Write leaderboard.{md,html,csv,json} under ``out``; returns (files written, problems)."""
    runs, problems = read_runs(paths)
    if not runs:
        return [], problems or ["no lm-eval results found"]
    models = sorted({run.pretrained for run in runs})
    if len(models) > 1:
        problems.append(f"runs of {len(models)} different models: comparisons only pair runs of the same model")
    by_task = build_rows(runs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    texts = {
        out / "leaderboard.md": markdown(by_task, runs, problems),
        out / "leaderboard.html": html(by_task, runs, problems),
        out / "leaderboard.csv": csv_text(by_task),
        out / "leaderboard.json": json_text(by_task, problems),
    }
    return write_atomically(texts), problems
