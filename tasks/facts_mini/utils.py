from pathlib import Path

from decodebench.metrics import squad_exact_match, squad_normalized_accuracy
from decodebench.taskdata import bundled_split

DATA = Path(__file__).with_name("facts_mini.jsonl")


def load(**kwargs):
    return bundled_split(DATA)


def process_results(doc, results):
    prediction = results[0]
    return {
        "normalized_accuracy": squad_normalized_accuracy(prediction, doc["answers"]),
        "exact_match": squad_exact_match(prediction, doc["answers"]),
    }
