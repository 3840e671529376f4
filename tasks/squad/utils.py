from pathlib import Path

from decodebench.data.taskdata import benchmark_records, bundled_split, split_of
from decodebench.metrics import squad_exact_match, squad_f1, squad_normalized_accuracy
from decodebench.metrics.generation import generation_metrics


def load(data_dir=None, **kwargs):
    """SQuAD v1.1 dev: from --metadata data_dir (squad/validation.jsonl), else the hub."""

    return split_of(benchmark_records("squad", data_dir), "validation")


def load_mini(**kwargs):
    return bundled_split(Path(__file__).with_name("squad_mini.jsonl"), "squad", split="validation")


def process_results(doc, results):
    prediction = results[0]
    answers = doc["answers"]["text"]
    return {
        "normalized_accuracy": squad_normalized_accuracy(prediction, answers),
        "exact_match": squad_exact_match(prediction, answers),
        "f1": squad_f1(prediction, answers),
        **generation_metrics(prediction),
    }
