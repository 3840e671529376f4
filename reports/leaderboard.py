"""``decodebench report RESULTS... --out DIR``: Markdown, HTML, CSV and JSON leaderboards."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from decodebench.reports.plots import task_plots
from decodebench.reports.reader import read_runs
from decodebench.reports.tables import Row, build_rows, csv_text, json_text, machine_name, markdown, metric_names


def _cell(value, digits: int = 3, title: str = "") -> dict:
    if value is None:
        return {"text": "-", "sort": "", "title": title}
    return {"text": f"{value:.{digits}f}", "sort": f"{value:.12g}", "title": title}


def _html_rows(rows: list[Row], metrics: list[str]) -> list[dict]:
    best = max((r.quality for r in rows if r.quality is not None), default=None)
    out = []
    for row in rows:
        energy = _cell(row.joules_per_token, 4, row.energy_note or "")
        if row.joules_per_token is None:
            energy["text"] = "unavailable"
        speed = _cell(row.tokens_per_second, 1, row.speed_note or "")
        if row.tokens_per_second is None and row.speed_note:
            speed["text"] = row.speed_note
        out.append(
            {
                "label": row.run.label,
                "best": best is not None and row.quality == best,
                "metrics": [_cell(row.task.metrics.get(m)) for m in metrics],
                "speed": speed,
                "ratio": {**_cell(row.speed_ratio, 2), "text": f"{row.speed_ratio:.2f}x"}
                if row.speed_ratio
                else _cell(None),
                "energy": energy,
                "loops": _cell(row.degenerate_rate, 2),
                "method": row.method_summary,
                "machine": machine_name(row.run),
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
        notes = [row.energy_note for row in rows if row.energy_note]
        tasks.append(
            {
                "name": name,
                "primary": rows[0].task.primary_metric if rows else None,
                "metrics": metrics,
                "rows": _html_rows(rows, metrics),
                "plots": task_plots(rows),
                "energy_note": notes[0] if notes else None,
            }
        )
    return environment.get_template("leaderboard.html.j2").render(
        runs=runs,
        tasks=tasks,
        machines=sorted({machine_name(run) for run in runs}),
        revisions=sorted({run.git_hash for run in runs if run.git_hash}),
        models=sorted({run.pretrained for run in runs}),
        written=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        problems=problems + [f"{run.path}: {p}" for run in runs for p in run.problems],
    )


def write_report(paths: list[str | Path], out: str | Path) -> tuple[list[Path], list[str]]:
    """Write leaderboard.{md,html,csv,json} under ``out``; returns (files written, problems)."""
    runs, problems = read_runs(paths)
    if not runs:
        return [], problems or ["no lm-eval results found"]
    models = sorted({run.pretrained for run in runs})
    if len(models) > 1:
        problems.append(f"runs of {len(models)} different models: speed ratios only compare runs of the same model")
    by_task = build_rows(runs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "leaderboard.md": markdown(by_task, runs, problems),
        "leaderboard.html": html(by_task, runs, problems),
        "leaderboard.csv": csv_text(by_task),
        "leaderboard.json": json_text(by_task, problems),
    }
    written = []
    for name, text in files.items():
        (out / name).write_text(text)
        written.append(out / name)
    return written, problems
