"""What decodebench adds to lm-eval, applied by the start-up hook (``decodebench._startup``).

Each function here receives an lm-eval module right after that module has executed:

- ``register_models``: our model names, as lazy ``"module:Class"`` placeholders, so nothing
  heavy is imported until lm-eval materialises the model it was asked for;
- ``add_task_folder``: every ``TaskManager`` that includes lm-eval's built-in tasks also scans
  our task folder, after the built-ins (so our ``aime`` deliberately overrides lm-eval's) and
  before a user's ``--include_path`` (so users can override ours);
- ``attach_sample_measurements``: per-request measurements (tokens, latency, energy, method
  statistics) are added to each logged sample, so ``--log_samples`` files carry them.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

# lm_eval --model NAME -> class. Each class dispatches on its `backend` argument.
MODELS = {
    "baseline": "decodebench.models.baseline:Baseline",
}

TASKS_DIR = Path(__file__).resolve().parent / "tasks"

_PATCHED = "_decodebench_patched"


def register_models(models_module) -> None:
    from lm_eval.api.registry import model_registry

    for name, target in MODELS.items():
        if name not in model_registry:
            model_registry.register(name, target=target)


def add_task_folder(manager_module) -> None:
    task_manager = manager_module.TaskManager
    original = task_manager.__init__
    if getattr(original, _PATCHED, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        if bound.arguments["include_defaults"]:
            user_paths = bound.arguments["include_path"]
            if user_paths is None:
                user_paths = []
            elif not isinstance(user_paths, (list, tuple)):
                user_paths = [user_paths]
            bound.arguments["include_path"] = [TASKS_DIR, *user_paths]
        original(*bound.args, **bound.kwargs)

    setattr(__init__, _PATCHED, True)
    task_manager.__init__ = __init__


def attach_sample_measurements(evaluator_module) -> None:
    original = evaluator_module.evaluate
    if getattr(original, _PATCHED, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def evaluate(*args, **kwargs):
        results = original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        lm = bound.arguments.get("lm")
        lm = getattr(lm, "lm", lm)  # --use_cache wraps the model in a CachingLM
        recorder = getattr(lm, "decodebench_recorder", None)
        if results and recorder is not None and "samples" in results:
            recorder.annotate_samples(results["samples"], bound.arguments.get("samples"))
        return results

    setattr(evaluate, _PATCHED, True)
    evaluator_module.evaluate = evaluate
