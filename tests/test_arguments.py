"""Model arguments: method arguments are parsed and removed, unknown ones fail clearly."""

from __future__ import annotations

from typing import ClassVar

import pytest

from decodebench.models.base import Arg
from decodebench.models.baseline import Baseline, BaselineMethod
from decodebench.models.hf import HFBackend


class Toy(BaselineMethod, HFBackend):
    method = "toy"
    method_args: ClassVar = {
        "strength": Arg(float, 0.15, "penalty strength", check=lambda v: "must be >= 0" if v < 0 else None),
        "window": Arg(int, 512, "window size"),
        "mode": Arg(str, "a", "mode", choices=("a", "b")),
        "flag": Arg(bool, False, "a switch"),
    }


def test_method_arguments_are_parsed_and_split_from_backend_arguments():
    method, backend = Toy.split_arguments(
        {"strength": "0.3", "window": 64, "mode": "b", "flag": "true", "dtype": "float32", "backend": "hf"}
    )
    assert method == {"strength": 0.3, "window": 64, "mode": "b", "flag": True}
    assert backend == {"dtype": "float32"}
    assert Toy.split_arguments({})[0] == {"strength": 0.15, "window": 512, "mode": "a", "flag": False}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"strength": -1.0}, "strength=-1.0: must be >= 0"),
        ({"window": 12.5}, "window must be an integer"),
        ({"window": True}, "window must be an integer"),
        ({"window": "big"}, "window must be an integer"),
        ({"strength": "strong"}, "strength must be a number"),
        ({"mode": "c"}, "choose one of \\['a', 'b'\\]"),
        ({"flag": "maybe"}, "flag must be true or false"),
    ],
)
def test_bad_method_arguments_fail_with_what_is_allowed(args, message):
    with pytest.raises(ValueError, match=message):
        Toy.split_arguments(args)


def test_unknown_argument_lists_the_allowed_ones():
    with pytest.raises(ValueError) as info:
        Toy.split_arguments({"windw": 3, "dtype": "float32"})
    text = str(info.value)
    assert "Unknown model argument(s) for --model toy with backend=hf: windw." in text
    assert "window (int, default 512): window size" in text
    assert "pretrained" in text and "max_length" in text and "dtype" in text


def test_backend_choice_is_checked_before_anything_loads():
    with pytest.raises(ValueError, match="backend='tpu' is not available for --model baseline; allowed: hf, vllm"):
        Baseline.create_from_arg_obj({"backend": "tpu"})
    with pytest.raises(ValueError, match="implements backend='hf', not 'vllm'"):
        Baseline.split_arguments({"backend": "vllm"})
