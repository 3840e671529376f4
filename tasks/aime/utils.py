from pathlib import Path

from lm_eval.tasks.aime.utils import process_results as aime_exact_match

from decodebench.metrics.generation import generation_metrics
from decodebench.taskdata import bundled_split


def load_mini(**kwargs):
    return bundled_split(Path(__file__).with_name("aime_mini.jsonl"))


def process_results(doc, results):
    """lm-eval's own AIME exact match, plus decodebench's generation metrics."""
    return {**aime_exact_match(doc, results), **generation_metrics(results[0])}
