"""Draws the bundled task samples (the ``*_mini`` tasks) from a copy of the real benchmarks.

    python studies/build_samples.py --data ../shared/data

The copy has the layout of the project's data pack (its README: sources, checksums, licenses):
``squad/validation.jsonl``, ``spider/validation.jsonl`` and ``spider/database/``,
``cnndm/test_cased_frank.jsonl``, ``aime/aime24/train.jsonl`` and ``aime/aime25/test.jsonl``. Each
sample is a seeded random draw of whole records, written unchanged in the hub's schema, next to a
DATA.md that says what it is, where it comes from, under which license, and how it was drawn.
GPQA is not sampled: its authors ask that its questions never appear in plain text online.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "tasks"
SEED = 0
SQUAD_QUESTIONS, SPIDER_QUESTIONS, CNNDM_ARTICLES = 500, 200, 100


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def draw(rows: list, count: int) -> list:
    """``count`` records drawn without replacement, in the order drawn."""
    return random.Random(SEED).sample(rows, count)


def write_data_md(task: str, title: str, lines: list[str]) -> None:
    """The task folder's DATA.md: what the sample is, where it comes from, its license."""
    text = [f"# {title}", "", *lines, "", f"Drawn by `python studies/build_samples.py` (seed {SEED}); rerun it on "]
    text[-1] += "the same files to get the same sample."
    (TASKS / task / "DATA.md").write_text("\n".join([*text, ""]))


def cc_by_sa(citation: str, task: str, full: str) -> list[str]:
    """The CC BY-SA 4.0 lines shared by the SQuAD and Spider samples."""
    return [
        f"- License: CC BY-SA 4.0 ({citation}). This sample is shared under the same license.",
        f"- A sample for offline runs, not the benchmark: `{task}` evaluates {full}.",
    ]


SQUAD_CITATION = (
    'Rajpurkar et al., "SQuAD: 100,000+ Questions for Machine Comprehension of Text", EMNLP 2016; '
    "https://rajpurkar.github.io/SQuAD-explorer/"
)
SPIDER_CITATION = (
    'Yu et al., "Spider: A Large-Scale Human-Labeled Dataset for Complex and Cross-Domain Semantic Parsing and '
    'Text-to-SQL Task", EMNLP 2018; https://yale-lily.github.io/spider'
)


def write_sample(task: str, rows: list[dict], count: int) -> list[dict]:
    """Draw ``count`` of ``rows`` and write them as the task's ``<task>_mini.jsonl``."""
    drawn = draw(rows, count)
    write_jsonl(TASKS / task / f"{task}_mini.jsonl", drawn)
    return drawn


def plain_sample(task: str, source: Path, count: int, title: str, about: str) -> None:
    """A sample drawn from one file, with its DATA.md: ``about`` (one paragraph per line) gets
    the sample's size and the source's checksum as ``{n}`` and ``{sha256}``."""
    rows = write_sample(task, read_jsonl(source), count)
    lines = about.format(n=len(rows), sha256=sha256(source)).strip().splitlines()
    write_data_md(task, title, [f"- {' '.join(line.split())}" for line in lines])


def squad(data: Path) -> None:
    about = f"""
{{n}} of the 10,570 questions of SQuAD v1.1 dev (`rajpurkar/squad`, `plain_text`, split `validation`), drawn at \
random, in the hub's schema (`id, title, context, question, answers`).
Source file: the flattened official `dev-v1.1.json` (sha256 of `validation.jsonl`: `{{sha256}}`).
License: CC BY-SA 4.0 ({SQUAD_CITATION}). This sample is shared under the same license.
A sample for offline runs, not the benchmark: `squad` evaluates all of dev.
"""
    source = data / "squad" / "validation.jsonl"
    plain_sample("squad", source, SQUAD_QUESTIONS, "squad_mini: a sample of SQuAD v1.1 dev", about)


def spider(data: Path) -> None:
    source = data / "spider" / "validation.jsonl"
    databases = data / "spider" / "database"
    rows = [r for r in read_jsonl(source) if (databases / r["db_id"] / f"{r['db_id']}.sqlite").is_file()]
    rows = write_sample("spider", rows, SPIDER_QUESTIONS)
    target = TASKS / "spider" / "database"
    shutil.rmtree(target, ignore_errors=True)
    needed = sorted({r["db_id"] for r in rows})
    for db_id in needed:
        (target / db_id).mkdir(parents=True)
        shutil.copyfile(databases / db_id / f"{db_id}.sqlite", target / db_id / f"{db_id}.sqlite")
    checksums = ", ".join(f"{db} `{sha256(target / db / f'{db}.sqlite')[:16]}`" for db in needed)
    write_data_md(
        "spider",
        "spider_mini: a sample of Spider dev",
        [
            f"- {len(rows)} of the 1,034 questions of Spider 1.0 dev (`xlangai/spider`, split `validation`), drawn at "
            "random among the questions whose database is available (the data pack lacks `wta_1.sqlite`), in the "
            "hub's schema (`db_id, query, question, query_toks, query_toks_no_value, question_toks`).",
            f"- The {len(needed)} real dev databases they need, unchanged, under `database/<db_id>/<db_id>.sqlite` "
            f"(sha256 prefixes: {checksums}).",
            f"- Source file sha256 of `validation.jsonl`: `{sha256(source)}`.",
            *cc_by_sa(SPIDER_CITATION, "spider", "all of dev"),
        ],
    )


def cnndm(data: Path) -> None:
    about = """
{n} of the 250 CNN/DailyMail 3.0.0 test articles in their original casing that the FRANK benchmark ships \
(`artidoro/frank`), drawn at random, in the hub's schema (`article, highlights, id`, the id being the hub's URL \
hash). `highlights` is FRANK's copy of the reference highlights: cased, PTB-tokenized, one sentence after another \
ending in " .".
Source file sha256: `{sha256}`.
Terms: the articles are (c) CNN and the Daily Mail, distributed for research (the hub's card lists Apache-2.0 for \
the dataset; FRANK is MIT). Use them for research and testing only.
A sample for offline runs, not the benchmark: `cnndm` evaluates the 11,490 test articles.
"""
    source = data / "cnndm" / "test_cased_frank.jsonl"
    plain_sample("cnndm", source, CNNDM_ARTICLES, "cnndm_mini: a sample of CNN/DailyMail test", about)


def aime(data: Path) -> None:
    files = {
        "aime_2024.jsonl": data / "aime" / "aime24" / "train.jsonl",
        "aime_2025.jsonl": data / "aime" / "aime25" / "test.jsonl",
    }
    for name, source in files.items():
        shutil.copyfile(source, TASKS / "aime" / name)
    write_data_md(
        "aime",
        "aime_mini: AIME 2024 and 2025",
        [
            "- All 60 problems of AIME 2024 and 2025 (I and II), copied unchanged: `aime_2024.jsonl` is "
            "`Maxwell-Jia/AIME_2024` (split `train`: `ID, Problem, Solution, Answer`) and `aime_2025.jsonl` is "
            "`math-ai/aime25` (split `test`: `problem, answer, id`). The task reads both into the `aime` task's "
            "fields (`ID, Question, Answer`).",
            f"- sha256: aime_2024.jsonl `{sha256(files['aime_2024.jsonl'])}`, aime_2025.jsonl "
            f"`{sha256(files['aime_2025.jsonl'])}`.",
            "- Licenses: MIT (`Maxwell-Jia/AIME_2024`) and Apache-2.0 (`math-ai/aime25`); the problems are (c) the "
            "Mathematical Association of America.",
            "- The full `aime` task is AIME 1983-2024 (933 problems); aime_mini is the two most recent years, not a "
            "random sample of it.",
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a copy of the benchmarks in the data pack's layout")
    data = Path(parser.parse_args(argv).data).resolve()
    for build in (squad, spider, cnndm, aime):
        build(data)
        print(f"{build.__name__}: written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
