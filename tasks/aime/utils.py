from pathlib import Path

from lm_eval.tasks.aime.utils import process_results as aime_exact_match

from decodebench.data.taskdata import benchmark_records, read_records, split_of
from decodebench.metrics.generation import generation_metrics

HERE = Path(__file__).parent


def load(data_dir=None, **kwargs):
    """AIME 1983-2024: from --metadata data_dir (aime/aime_1983_2024/train.jsonl), else the hub."""

    return split_of(benchmark_records("aime", data_dir), "train")


def load_mini(**kwargs):
    """AIME 2024 and 2025, each in its own hub schema, read into the aime task's fields."""
    problems = [
        {"ID": r["ID"], "Question": r["Problem"], "Answer": str(r["Answer"])}
        for r in read_records(HERE / "aime_2024.jsonl", ("ID", "Problem", "Answer"))
    ]
    problems += [
        {"ID": f"2025-{r['id']}", "Question": r["problem"], "Answer": str(r["answer"])}
        for r in read_records(HERE / "aime_2025.jsonl", ("id", "problem", "answer"))
    ]
    return split_of(problems, "test")


def process_results(doc, results):
    """lm-eval's own AIME exact match, plus decodebench's generation metrics."""
    return {**aime_exact_match(doc, results), **generation_metrics(results[0])}
