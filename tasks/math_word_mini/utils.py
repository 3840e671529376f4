import re
from pathlib import Path

from decodebench.metrics import degenerate_repetition
from decodebench.taskdata import bundled_split

DATA = Path(__file__).with_name("math_word_mini.jsonl")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def load(**kwargs):
    return bundled_split(DATA)


def final_number(text: str) -> str | None:
    """The answer a math word problem's generation commits to: the last number it writes."""
    numbers = NUMBER.findall(text)
    if not numbers:
        return None
    value = numbers[-1].replace(",", "")
    return value[:-2] if value.endswith(".0") else value


def process_results(doc, results):
    prediction = results[0]
    return {
        "exact_match": float(final_number(prediction) == doc["answer"]),
        "degenerate_repetition": float(degenerate_repetition(prediction)),
    }
