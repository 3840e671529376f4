from pathlib import Path

from decodebench.metrics import rouge
from decodebench.metrics.generation import generation_metrics
from decodebench.taskdata import bundled_split


def load_mini(**kwargs):
    return bundled_split(Path(__file__).with_name("cnndm_mini.jsonl"))


def process_results(doc, results):
    prediction = results[0]
    return {**rouge(prediction, doc["highlights"]), **generation_metrics(prediction)}
