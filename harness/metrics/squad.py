"""SQuAD scoring: the official v1.1 normalization, EM and F1, and the nugget paper's accuracy.

``normalize_answer``, ``squad_exact_match`` and ``squad_f1`` follow the official SQuAD v1.1
evaluation script (lower-case, drop punctuation, drop the articles a/an/the, collapse
whitespace; EM and bag-of-tokens F1, each the max over the gold answers).
``squad_normalized_accuracy`` is the metric of the nugget paper (Qin et al., section 6.1 and
appendix E): both texts are normalized by the paper's rules (English number words to digits,
punctuation to spaces, strip, lower-case) and a generation is correct when it *contains* a
gold answer, which credits correct answers wrapped in a sentence. Containment is of whole
words: the normalized answer must appear as a run of whole words of the normalized generation,
so "Roger Goodell" does not contain the answer "L" and "1,300,000" does not contain "three" (3).
The paper says "contains" without saying how; matching inside words credits wrong answers
(10 of 2,000 real wrong answers on SQuAD dev), which no reader of "contains" intends. We also
collapse runs of whitespace, which only undoes the double spaces that "punctuation to spaces"
creates.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Official SQuAD v1.1 normalization."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _answers(answers: str | Iterable[str]) -> list[str]:
    return [answers] if isinstance(answers, str) else list(answers)


def squad_exact_match(prediction: str, answers: str | Iterable[str]) -> float:
    """1.0 when the normalized prediction equals a normalized gold answer."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in _answers(answers)))


def _f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_f1(prediction: str, answers: str | Iterable[str]) -> float:
    """Token-overlap F1, max over gold answers (official v1.1 definition)."""
    return max((_f1(prediction, gold) for gold in _answers(answers)), default=0.0)


_UNITS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = {
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}
_NUMBER_WORDS = {word: value for value, word in enumerate(_UNITS)} | _TENS
_WORD = re.compile(r"[A-Za-z]+|[^A-Za-z]+")


def _number_words_to_digits(text: str) -> str:
    """ "two" -> "2", "twenty-one"/"twenty one" -> "21" (the paper's first rule)."""
    parts = _WORD.findall(text)
    out: list[str] = []
    i = 0
    while i < len(parts):
        value = _NUMBER_WORDS.get(parts[i].lower())
        if value is None:
            out.append(parts[i])
            i += 1
            continue
        # tens followed by a unit word, joined by a space or hyphen: "twenty one", "twenty-one"
        if (
            value in _TENS.values()
            and i + 2 < len(parts)
            and parts[i + 1] in (" ", "-")
            and 1 <= _NUMBER_WORDS.get(parts[i + 2].lower(), 0) <= 9
        ):
            value += _NUMBER_WORDS[parts[i + 2].lower()]
            i += 2
        out.append(str(value))
        i += 1
    return "".join(out)


def nugget_normalize(text: str) -> str:
    """The nugget paper's answer normalization (appendix E)."""
    text = _number_words_to_digits(text)
    text = "".join(" " if ch in _PUNCTUATION else ch for ch in text)
    return " ".join(text.split()).lower()


def squad_normalized_accuracy(prediction: str, answers: str | Iterable[str]) -> float:
    """1.0 when the normalized prediction contains a normalized, non-empty gold answer as whole words."""
    pred = f" {nugget_normalize(prediction)} "
    return float(any((gold := nugget_normalize(answer)) and f" {gold} " in pred for answer in _answers(answers)))
