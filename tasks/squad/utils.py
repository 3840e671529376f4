from pathlib import Path

from decodebench.metrics import squad_exact_match, squad_f1, squad_normalized_accuracy
from decodebench.metrics.generation import generation_metrics
from decodebench.taskdata import bundled_split


def load_mini(**kwargs):
    return bundled_split(Path(__file__).with_name("squad_mini.jsonl"), split="validation")


def process_results(doc, results):
    prediction = results[0]
    answers = doc["answers"]["text"]
    return {
        "normalized_accuracy": squad_normalized_accuracy(prediction, answers),
        "exact_match": squad_exact_match(prediction, answers),
        "f1": squad_f1(prediction, answers),
        **generation_metrics(prediction),
    }
