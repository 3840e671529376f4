"""Typed method configurations: the one place where each ``--model_args`` argument of a method gets
its type, default, help and check.

A method's configuration is a frozen dataclass whose fields are declared with ``option``::

    @dataclass(frozen=True)
    class LZConfig(MethodConfig):
        window: int = option(512, "how many past tokens the compressor searches", check=at_least(2))

``LZConfig.parse(model_args)`` takes the method's own arguments out of lm-eval's ``--model_args``
(after lm-eval's parser: ``"-1"`` arrives as ``-1.0``, ``"nan"`` as a float), coerces each to its
declared type, checks it, and leaves the rest for the backend. One rule holds for every method:
integers accept integral numbers (``-1.0`` is ``-1``), floats must be finite, and a value out of
range fails with the argument's name and the allowed range before anything loads. Kernels,
processors, studies and the README take their defaults from these classes (``defaults()``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

Check = Callable[[Any], str | None]  # returns what is wrong with a value, or None


def option(default: Any, help: str, *, choices: tuple | list | None = None, check: Check | None = None):
    """A configuration field: its default, a one-line help, and optionally allowed values or a check."""
    return dataclasses.field(
        default=default, metadata={"help": help, "choices": tuple(choices) if choices else None, "check": check}
    )


def at_least(low: float, *, strict: bool = False) -> Check:
    def check(value):
        if value < low or (strict and value == low):
            return f"must be {'>' if strict else '>='} {low}"
        return None

    return check


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Check:
    """A value in the interval written as usual: [low, high], (low, high], [low, high) ..."""
    interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"

    def check(value):
        below = value < low or (low_open and value == low)
        above = value > high or (high_open and value == high)
        return f"must be in {interval}" if below or above else None

    return check


@dataclasses.dataclass(frozen=True)
class Option:
    """One declared argument, as read from a config class's fields."""

    name: str
    kind: type  # int, float, str or bool
    optional: bool  # None is allowed (it then means "the method's own default")
    default: Any
    help: str
    choices: tuple | None
    check: Check | None

    @property
    def type_name(self) -> str:
        return self.kind.__name__

    def describe(self) -> str:
        allowed = f"; one of {', '.join(map(str, self.choices))}" if self.choices else ""
        return f"{self.name} ({self.type_name}, default {self.default!r}{allowed}): {self.help}"

    def parse(self, value: Any) -> Any:
        if value is None or (self.optional and isinstance(value, str) and value.lower() == "none"):
            if self.optional:
                return None
            raise ValueError(f"{self.name} needs a value ({self.type_name})")
        value = self._coerce(value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name}={value!r} is not allowed; choose one of {list(self.choices)}")
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ValueError(f"{self.name}={value!r}: {problem}")
        return value

    def _coerce(self, value: Any) -> Any:
        name, kind = self.name, self.kind
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise ValueError(f"{name} must be true or false, got {value!r}")
        if kind is str:
            return str(value)
        if isinstance(value, bool):
            raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"{name}={value!r}: must be a finite number")
        if kind is int:
            # lm-eval's parser turns "-1" into -1.0: integral numbers are integers
            if isinstance(value, int):
                return value
            if not number.is_integer():
                raise ValueError(f"{name} must be an integer, got {value!r}")
            return int(number)
        return number


@dataclasses.dataclass(frozen=True)
class MethodConfig:
    """Base of every method's configuration (a method without arguments uses it as is)."""

    _options: ClassVar[dict[type, list[Option]]] = {}

    @classmethod
    def options(cls) -> list[Option]:
        if cls not in MethodConfig._options:
            hints = typing.get_type_hints(cls)
            found = []
            for field in dataclasses.fields(cls):
                kind, optional = _unwrap_optional(hints[field.name])
                found.append(
                    Option(
                        name=field.name,
                        kind=kind,
                        optional=optional,
                        default=field.default,
                        help=field.metadata.get("help", ""),
                        choices=field.metadata.get("choices"),
                        check=field.metadata.get("check"),
                    )
                )
            MethodConfig._options[cls] = found
        return MethodConfig._options[cls]

    @classmethod
    def defaults(cls) -> Self:
        return cls().validated()

    @classmethod
    def parse(cls, args: Mapping[str, Any]) -> tuple[Self, dict[str, Any]]:
        """(the checked configuration, the arguments that are not the method's)."""
        rest = dict(args)
        values = {opt.name: opt.parse(rest.pop(opt.name)) for opt in cls.options() if opt.name in rest}
        return cls(**values).validated(), rest

    def validated(self) -> Self:
        """Checks between arguments, and defaults that depend on other arguments (none here)."""
        return self

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def describe(cls) -> str:
        return "; ".join(opt.describe() for opt in cls.options()) or "none"


def _unwrap_optional(hint) -> tuple[type, bool]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(members) == 1:
            return members[0], True
    return hint, False
