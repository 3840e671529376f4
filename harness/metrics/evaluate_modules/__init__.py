"""decodebench's metrics as local Hugging Face ``evaluate`` modules, for people who score with ``evaluate`` outside
lm-eval: each module calls the same code as decodebench's tasks (``decodebench.metrics``), so it gives the same
numbers. ``evaluate.load`` cannot reach the hub offline, but loads a local script:

    import evaluate
    from decodebench.metrics.evaluate_modules import module_path

    squad = evaluate.load(module_path("squad_normalized_accuracy"))
    squad.compute(predictions=["It was Denver."], references=[["Denver Broncos", "Denver"]])
"""

from __future__ import annotations

from pathlib import Path

MODULES = ("squad_normalized_accuracy", "spider_execution_accuracy", "degenerate_repetition", "infinigram_agreement")


# what each module's predictions and references are (evaluate checks and batches them by these)
TEXTS = {"predictions": "string"}
TEXT_PAIRS = {"predictions": "string", "references": "string"}
TEXT_AND_ANSWERS = {"predictions": "string", "references": ["string"]}


def metric_info(description: str, citation: str, inputs: str, columns: dict):
    """A module's ``evaluate.MetricInfo``: its docstring, the papers, its arguments, its columns' types."""
    import datasets
    import evaluate

    def feature(kind):
        return datasets.Sequence(datasets.Value(kind[0])) if isinstance(kind, list) else datasets.Value(kind)

    features = datasets.Features({name: feature(kind) for name, kind in columns.items()})
    return evaluate.MetricInfo(description=description, citation=citation, inputs_description=inputs, features=features)


def module_path(name: str) -> str:
    """The local ``evaluate`` script of one of ``MODULES``, for ``evaluate.load``."""
    if name not in MODULES:
        raise ValueError(f"no decodebench evaluate module {name!r}; known: {', '.join(MODULES)}")
    return str(Path(__file__).with_name(f"{name}.py"))
