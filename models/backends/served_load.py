"""How a served run loads its server, and the latency objectives its goodput is counted against.

Two ways to load a server, as the serving benchmarks drive them:

- **closed loop** (``num_concurrent=C``, the default): ``C`` requests in flight, the next sent as one finishes;
- **open loop** (``request_rate=R``, requests per second): requests arrive on a schedule of their own, whatever the
  server is doing, the first at once and then gaps drawn from a gamma distribution of shape ``burstiness`` and mean
  ``1/R``, seeded, exactly as ``vllm bench serve`` draws them (``--request-rate``, ``--burstiness``): Poisson
  arrivals for burstiness 1, burstier below 1, steadier above; ``max_concurrency`` caps what is in flight (none by
  default), as ``vllm bench serve --max-concurrency`` does.

Goodput (``slo=ttft:500;tpot:50``, milliseconds unless ``s`` is given, as vLLM's ``--goodput`` names them: ttft,
tpot, e2el): per task, the share of requests that met every objective (with its Wilson interval and n) and the
requests per second that did.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

# an objective's name (vLLM's --goodput) -> the request measurement it bounds (measure/recorder.py: RequestRecord)
SLO_MEASURES = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "latency_s"}
MAX_REQUEST_RATE = 1e6


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """When each of ``n`` requests is sent, in seconds from the first: 0, then the cumulative sum of gaps drawn from
    Gamma(shape=burstiness, scale=1 / (rate * burstiness)), whose mean is 1/rate and coefficient of variation
    1/sqrt(burstiness) (vllm bench serve's arrival process; Poisson for burstiness 1)."""
    if n <= 0:
        return np.zeros(0)
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


@dataclass(frozen=True)
class Load:
    """A closed loop of ``in_flight`` requests (``request_rate`` None), or an open loop at ``request_rate``."""

    in_flight: int | None  # the cap on requests in flight; None: no cap (open loop only)
    request_rate: float | None = None
    burstiness: float = 1.0
    seed: int = 0

    @classmethod
    def from_args(cls, num_concurrent, request_rate, burstiness, max_concurrency, seed) -> Load:
        """The load a served run's arguments ask for; a ValueError naming what is wrong and what is allowed."""
        if request_rate is None:
            if burstiness is not None or max_concurrency is not None:
                raise ValueError("burstiness and max_concurrency shape an open loop: give request_rate=R with them")
            in_flight = _whole(num_concurrent if num_concurrent is not None else 1, "num_concurrent")
            return cls(in_flight)
        if num_concurrent is not None:
            raise ValueError(
                "num_concurrent is the closed loop's requests in flight; with request_rate=R, cap what is in flight "
                "with max_concurrency=C"
            )
        rate = _positive(request_rate, "request_rate")
        if rate > MAX_REQUEST_RATE:
            raise ValueError(f"request_rate={request_rate}: must be at most {MAX_REQUEST_RATE:g} requests/s")
        shape = _positive(burstiness if burstiness is not None else 1.0, "burstiness")
        cap = _whole(max_concurrency, "max_concurrency") if max_concurrency is not None else None
        return cls(cap, rate, shape, int(seed))

    @property
    def open(self) -> bool:
        return self.request_rate is not None

    def describe(self) -> dict:
        if not self.open:
            return {"loop": "closed", "in_flight": self.in_flight}
        return {
            "loop": "open",
            "request_rate": self.request_rate,
            "burstiness": self.burstiness,
            "max_concurrency": self.in_flight,
            "seed": self.seed,
        }


def _positive(value, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: must be a number > 0") from None
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name}={value!r}: must be a finite number > 0")
    return number


def _whole(value, name: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: must be a whole number >= 1") from None
    if not (math.isfinite(number) and number == int(number) and number >= 1):
        raise ValueError(f"{name}={value!r}: must be a whole number >= 1")
    return int(number)


def parse_slo(text: str) -> dict[str, float]:
    """``ttft:500;tpot:50`` (or separated by spaces; values in ms, or with ``ms``/``s``) -> {"ttft_s": 0.5, ...}."""
    objectives = {}
    for part in filter(None, re.split(r"[;\s]+", str(text).strip())):
        name, _, value = part.partition(":")
        if name not in SLO_MEASURES:
            raise ValueError(f"slo={text!r}: unknown objective {name!r}; allowed: {sorted(SLO_MEASURES)}")
        match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)?", value.strip())
        if match is None:
            raise ValueError(f"slo={text!r}: {name}'s limit {value!r} must be a number of ms (or with ms or s)")
        seconds = float(match.group(1)) / (1 if match.group(2) == "s" else 1000)
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"slo={text!r}: {name}'s limit must be > 0")
        objectives[SLO_MEASURES[name]] = seconds
    if not objectives:
        raise ValueError(f"slo={text!r}: name at least one objective, e.g. slo=ttft:500;tpot:50 (ms)")
    return objectives
