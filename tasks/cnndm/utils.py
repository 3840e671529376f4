from pathlib import Path

from decodebench.data.taskdata import benchmark_records, bundled_split, split_of
from decodebench.metrics import rouge
from decodebench.metrics.generation import generation_metrics


def load(data_dir=None, **kwargs):
    """CNN/DailyMail 3.0.0 test: from --metadata data_dir (cnndm/test.jsonl), else the hub."""

    return split_of(benchmark_records("cnndm", data_dir), "test")


def load_mini(**kwargs):
    return bundled_split(Path(__file__).with_name("cnndm_mini.jsonl"), "cnndm")


def process_results(doc, results):
    prediction = results[0]
    return {**rouge(prediction, doc["highlights"]), **generation_metrics(prediction)}
