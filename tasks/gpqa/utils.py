import hashlib
import random
import re
from pathlib import Path

from decodebench.data.taskdata import FIELDS, benchmark_records, read_records, split_of
from decodebench.metrics.generation import generation_metrics

LETTERS = "ABCD"
_ANSWER_IS = re.compile(r"answer is:?\s*\(?\s*([ABCD])\b", re.IGNORECASE)
_PARENS = re.compile(r"\(([ABCD])\)")
_TRAILING = re.compile(r"\b([ABCD])\W*$")


def shuffled(record: dict) -> dict:
    """The four choices in an order fixed by the question text (reproducible without a seed)."""
    choices = [
        record["Correct Answer"],
        record["Incorrect Answer 1"],
        record["Incorrect Answer 2"],
        record["Incorrect Answer 3"],
    ]
    choices = [c.strip() for c in choices]
    seed = int(hashlib.sha256(record["Question"].encode()).hexdigest()[:8], 16)
    order = random.Random(seed).sample(range(4), 4)
    return {
        "question": record["Question"].strip(),
        "choices": [choices[i] for i in order],
        "answer": LETTERS[order.index(0)],
    }


def _dataset(records):
    return split_of([shuffled(r) for r in records], "train")


def load_mini(**kwargs):
    return _dataset(read_records(Path(__file__).with_name("gpqa_mini.jsonl"), FIELDS["gpqa"]))


def load(data_dir=None, **kwargs):
    """GPQA diamond: from --metadata data_dir (gpqa/gpqa_diamond.csv, the hub's CSV), else the gated hub."""

    return _dataset(benchmark_records("gpqa", data_dir))


def extract_letter(text: str) -> str | None:
    """The answer letter: the last "answer is (X)", else the last "(X)", else a trailing letter."""
    for pattern in (_ANSWER_IS, _PARENS):
        found = pattern.findall(text)
        if found:
            return found[-1].upper()
    trailing = _TRAILING.search(text.strip())
    return trailing.group(1) if trailing else None


def process_results(doc, results):
    prediction = results[0]
    return {"exact_match": float(extract_letter(prediction) == doc["answer"]), **generation_metrics(prediction)}
