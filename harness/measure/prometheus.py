"""Reading a Prometheus ``/metrics`` page (vLLM's server, a DCGM exporter) into plain numbers.

``scrape(url)`` returns ``{name: total}`` with the samples of each metric summed over their labels
(every GPU, every model), and ``{name{label=value}: value}`` for the labelled samples too, so that a
caller can take a total or one series; a series per ``position`` is also ``name[position]``. Counters are
read before and after a measurement window and differenced (``deltas``); gauges are read as they are.
"""

from __future__ import annotations

import math
from collections import defaultdict

from decodebench.measure import http


class ScrapeError(RuntimeError):
    """A metrics page that cannot be fetched or read; the message names the URL."""


# how long one scrape may take, the page read whole (read at each call, so a test can shorten it)
SCRAPE_TIMEOUT_S = 5.0


def scrape(url: str, timeout_s: float | None = None, headers: dict[str, str] | None = None) -> dict[str, float]:
    """The page's samples (bounded in time and size: measure/http.py; ``SCRAPE_TIMEOUT_S`` unless ``timeout_s``); a
    sample that is not a finite number (NaN, a gauge with nothing measured yet) is left out, as unavailable, rather
    than poisoning a total."""
    from prometheus_client.parser import text_string_to_metric_families

    timeout_s = SCRAPE_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        text = http.get(url, headers, timeout_s).decode("utf-8", errors="replace")
    except OSError as exc:
        raise ScrapeError(f"cannot read the metrics at {url}: {exc}") from None
    values: dict[str, float] = defaultdict(float)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not math.isfinite(sample.value):
                    continue
                values[sample.name] += sample.value
                if sample.labels:
                    labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                    values[f"{sample.name}{{{labels}}}"] = sample.value
                if "position" in sample.labels:  # a vector (acceptance per draft position): name[i], as vLLM's LLM
                    values[f"{sample.name}[{sample.labels['position']}]"] += sample.value
    except ValueError as exc:
        raise ScrapeError(f"{url} is not a Prometheus metrics page: {exc}") from None
    return dict(values)


def deltas(before: dict[str, float], after: dict[str, float], prefixes: tuple[str, ...]) -> dict[str, float]:
    """How much each counter whose name starts with one of ``prefixes`` grew between two scrapes."""
    return {
        name: after[name] - before.get(name, 0.0)
        for name in sorted(after)
        if name.startswith(prefixes) and "{" not in name and name.split("[")[0].endswith("_total")
    }
