"""Peak memory of a measurement window, or a stated reason why it is not measured.

- ``CudaMemory``: the CUDA caching allocator's peak of allocated bytes during the window
  (``torch.cuda.reset_peak_memory_stats`` when it opens, ``max_memory_allocated`` when it closes):
  weights, activations and KV cache together, what must fit on the device;
- ``ResidentMemory``: on the CPU, the process's peak resident set during the window above what it
  held when the window opened. Linux keeps the peak (``VmHWM``) and lets a process reset it to the
  current value (``5`` written to ``/proc/self/clear_refs``), so this costs two file reads and a
  write per window and no sampling thread;
- ``NoMemory``: not measured here (vLLM runs its engine in other processes), with the reason.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


class MemoryMeter(Protocol):
    source: str  # "cuda-allocator-peak", "cpu-resident-growth" or "unavailable"
    reason: str | None

    def start(self) -> None: ...

    def peak_bytes(self) -> int | None: ...


class NoMemory:
    source = "unavailable"

    def __init__(self, reason: str):
        self.reason = reason

    def start(self) -> None:
        pass

    def peak_bytes(self) -> None:
        return None


class CudaMemory:
    source = "cuda-allocator-peak"
    reason = None

    def __init__(self, device):
        import torch

        self._cuda, self._device = torch.cuda, device

    def start(self) -> None:
        self._cuda.reset_peak_memory_stats(self._device)

    def peak_bytes(self) -> int:
        return int(self._cuda.max_memory_allocated(self._device))


class ResidentMemory:
    source = "cpu-resident-growth"
    reason = None

    def __init__(self):
        self._start = self._kib("VmRSS")
        self._reset()  # fails here, not in a window, where the kernel does not allow it

    @staticmethod
    def _kib(field: str) -> int:
        return int(re.search(rf"{field}:\s+(\d+)", _STATUS.read_text()).group(1))

    @staticmethod
    def _reset() -> None:
        _CLEAR_REFS.write_text("5")

    def start(self) -> None:
        self._reset()
        self._start = self._kib("VmRSS")

    def peak_bytes(self) -> int:
        return max(0, self._kib("VmHWM") - self._start) * 1024


def open_memory_meter(device_type: str, device=None) -> MemoryMeter:
    """The memory meter for the device that runs the model; never raises."""
    try:
        if device_type == "cuda":
            return CudaMemory(device)
        if device_type == "cpu":
            return ResidentMemory()
    except (OSError, AttributeError, ValueError) as exc:
        return NoMemory(f"peak memory cannot be read here: {exc}")
    return NoMemory(f"no memory meter is known for device type '{device_type}'")
