"""Method configurations: parsing, one rule for every argument, and clear errors before anything loads."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from decodebench.models.baseline import Baseline
from decodebench.models.config import MethodConfig, at_least, between, option
from decodebench.models.method import Method


@dataclass(frozen=True)
class ToyConfig(MethodConfig):
    strength: float = option(0.15, "penalty strength", check=at_least(0))
    window: int = option(512, "window size", check=at_least(2))
    share: float = option(0.5, "a share", check=between(0, 1, low_open=True))
    mode: str = option("a", "mode", choices=("a", "b"))
    flag: bool = option(False, "a switch")
    limit: int | None = option(None, "an optional count")


class Toy(Method):
    name = "toy"
    label = "a toy method"
    Config = ToyConfig


def test_method_arguments_are_parsed_and_the_rest_left_to_the_backend():
    config, rest = ToyConfig.parse(
        {"strength": "0.3", "window": 64, "mode": "b", "flag": "true", "dtype": "float32", "limit": -1.0 + 5}
    )
    assert config == ToyConfig(strength=0.3, window=64, mode="b", flag=True, limit=4)
    assert rest == {"dtype": "float32"}
    assert ToyConfig.parse({})[0] == ToyConfig.defaults() == ToyConfig()


def test_integral_numbers_are_integers_as_lm_evals_parser_gives_them():
    # lm-eval's CLI parser turns "-1" into -1.0; an integer argument takes it as -1
    config, _ = ToyConfig.parse({"limit": -1.0, "window": 8.0})
    assert config.limit == -1 and isinstance(config.limit, int) and config.window == 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"strength": -1.0}, "strength=-1.0: must be >= 0"),
        ({"strength": float("nan")}, "strength=nan: must be a finite number"),
        ({"strength": "inf"}, "strength='inf': must be a finite number"),
        ({"share": 0.0}, r"share=0.0: must be in \(0, 1\]"),
        ({"share": 1.5}, r"share=1.5: must be in \(0, 1\]"),
        ({"window": 12.5}, "window must be an integer"),
        ({"window": True}, "window must be an integer"),
        ({"window": "big"}, "window must be an integer"),
        ({"window": 1}, "window=1: must be >= 2"),
        ({"strength": "strong"}, "strength must be a number"),
        ({"mode": "c"}, "choose one of \\['a', 'b'\\]"),
        ({"flag": "maybe"}, "flag must be true or false"),
    ],
)
def test_bad_method_arguments_fail_with_what_is_allowed(args, message):
    with pytest.raises(ValueError, match=message):
        ToyConfig.parse(args)


def test_unknown_argument_lists_the_method_and_backend_arguments():
    with pytest.raises(ValueError) as info:
        Toy.create({"windw": 3, "dtype": "float32"})
    text = str(info.value)
    assert "Unknown model argument(s) for --model toy with backend=hf: windw." in text
    assert "window (int, default 512): window size" in text
    assert "mode (str, default 'a'; one of a, b): mode" in text
    assert "pretrained" in text and "max_length" in text and "dtype" in text


def test_backend_choice_is_checked_before_anything_loads():
    with pytest.raises(ValueError, match="backend='tpu' is not available for --model baseline; allowed: hf, vllm"):
        Baseline.create({"backend": "tpu"})
    with pytest.raises(ValueError, match="backend='vllm' is not available for --model toy; allowed: hf"):
        Toy.create({"backend": "vllm"})


def test_every_registered_method_has_a_typed_config_with_help():
    from decodebench.models.registry import load_method, methods

    for name, target in methods().items():
        method = load_method(target)
        assert method.name == name and method.label
        for opt in method.Config.options():
            assert opt.help, f"{name}.{opt.name} has no help"
            assert opt.kind in (int, float, str, bool)
        method.Config.defaults()  # the defaults pass the method's own checks
