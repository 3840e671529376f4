"""Both sides of a comparison, for ``decodebench compare`` and ``decodebench sweep``: the method's and the
baseline's ``--model_args``, parsed and checked as lm_eval would check them before any round runs, and the commands'
errors as exit codes."""

from __future__ import annotations

import functools
import sys

SIDES = ("baseline", "method")


def parse_model_args(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    pairs = [pair.split("=", 1) for pair in text.split(",") if pair]
    bad = [pair[0] for pair in pairs if len(pair) != 2]
    if bad:
        raise ValueError(f"model arguments are key=value pairs separated by commas; not understood: {bad}")
    return dict(pairs)


def method_class(model: str) -> type:
    from decodebench.models.registry import load_method, methods

    registered = methods()
    if model not in registered:
        raise ValueError(f"--model {model} is not a decodebench method; known: {', '.join(sorted(registered))}")
    return load_method(registered[model])


def backend_args(model: str, model_args: dict[str, str]) -> dict[str, str]:
    """The method's arguments that are not its own (pretrained, backend, engine settings): the baseline's."""
    own = {option.name for option in method_class(model).Config.options()}
    return {key: value for key, value in model_args.items() if key not in own}


def check_both(model: str, model_args: dict[str, str], baseline_args: dict[str, str]) -> None:
    """Both sides' arguments, checked as lm_eval would check them, before any round runs."""
    from lm_eval.utils import simple_parse_args_string

    for side, name, args in (("baseline", "baseline", baseline_args), ("method", model, model_args)):
        parsed = simple_parse_args_string(",".join(f"{k}={v}" for k, v in args.items()))  # lm_eval's own typing
        try:
            method_class(name).check_args(parsed)
        except ValueError as exc:
            raise ValueError(f"the {side}'s --model_args: {exc}") from None


class UsageError(ValueError):
    """What a command was given cannot run: it exits 2 with this message, before anything runs."""


def exit_codes(command):
    """A command's body with its errors as exit codes: 2 and the message for a ``UsageError``, 1 and the message
    for a run that failed (``RuntimeError``); lm_eval's own output above says the rest."""

    @functools.wraps(command)
    def wrapped(*args, **kwargs) -> int:
        try:
            return command(*args, **kwargs)
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1

    return wrapped


def checked_sides(
    model: str, model_args: str | None, baseline_args: str | None, rounds: int, as_run=lambda args: args
) -> tuple[dict[str, str], dict[str, str]]:
    """(the method's, the baseline's) --model_args, parsed and checked before any round runs (``as_run``: what a
    run adds to them); the baseline's default to the method's backend arguments. A UsageError says what is wrong."""
    if rounds < 1:
        raise UsageError("--rounds must be at least 1")
    try:
        method_args = parse_model_args(model_args)
        base_args = parse_model_args(baseline_args) or backend_args(model, method_args)
        check_both(model, as_run(method_args), as_run(base_args))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return method_args, base_args
