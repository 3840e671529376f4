"""Energy meters: cumulative joules from hardware counters, or a stated reason why not.

Every meter exposes ``read() -> float``: joules consumed by the metered devices since the meter
was created. A measurement window is the difference of two reads. Meters never estimate: where
no counter can be read, ``UnavailableMeter`` says why and the reports show "unavailable".

- ``NvmlMeter``: NVIDIA GPUs through NVML (nvidia-ml-py). Volta and newer expose a total-energy
  counter (mJ, ``nvmlDeviceGetTotalEnergyConsumption``); older GPUs only report power, so a
  background thread samples ``nvmlDeviceGetPowerUsage`` and integrates it (trapezoid rule),
  labelled ``nvml-power-sampling``. The counter updates about every 100 ms: each meter states its
  ``resolution_s``, and a window shorter than that is flagged and left unmetered, never 0 J.
- ``RaplMeter``: CPU package energy from ``/sys/class/powercap/intel-rapl:N/energy_uj`` (the
  same driver serves recent AMD CPUs), with counter wrap-around handled. Usually root-only.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class EnergyMeter(Protocol):
    source: str  # "nvml-energy-counter", "nvml-power-sampling", "rapl" or "unavailable"
    reason: str | None  # why energy is unavailable, None when it is measured
    devices: list[str]
    resolution_s: float  # windows shorter than this are not metered (never read as 0 J)

    @property
    def available(self) -> bool: ...

    def read(self) -> float: ...

    def close(self) -> None: ...


@dataclass
class UnavailableMeter:
    reason: str
    source: str = "unavailable"
    resolution_s: float = 0.0

    def __post_init__(self):
        self.devices: list[str] = []

    @property
    def available(self) -> bool:
        return False

    def read(self) -> float:
        raise RuntimeError(f"energy is unavailable: {self.reason}")

    def close(self) -> None:
        pass


class RaplMeter:
    """Sum of the package-level RAPL zones (``intel-rapl:N``; sub-zones would double count)."""

    source = "rapl"
    reason = None
    resolution_s = 0.001  # RAPL's energy status registers update about every millisecond

    def __init__(self, root: str | os.PathLike = "/sys/class/powercap"):
        root = Path(root)
        zones = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
        if not zones:
            raise OSError(f"no RAPL zones under {root}")
        self._zones = zones
        self._max = [self._read_int(zone / "max_energy_range_uj") for zone in zones]
        self._last = [self._read_int(zone / "energy_uj") for zone in zones]
        self._total_uj = 0
        self._lock = threading.Lock()
        self.devices = [self._zone_name(zone) for zone in zones]

    @staticmethod
    def _read_int(path: Path) -> int:
        return int(path.read_text().strip())

    @staticmethod
    def _zone_name(zone: Path) -> str:
        name_file = zone / "name"
        return f"{zone.name} ({name_file.read_text().strip()})" if name_file.exists() else zone.name

    @property
    def available(self) -> bool:
        return True

    def read(self) -> float:
        with self._lock:
            for i, zone in enumerate(self._zones):
                now = self._read_int(zone / "energy_uj")
                delta = now - self._last[i]
                if delta < 0:  # the counter wrapped at max_energy_range_uj
                    delta += self._max[i] + 1
                self._total_uj += delta
                self._last[i] = now
            return self._total_uj / 1e6

    def close(self) -> None:
        pass


# NVML's total-energy counter moves in steps about 100 ms apart (Zeus and the ML.ENERGY notes).
NVML_COUNTER_RESOLUTION_S = 0.1


class NvmlMeter:
    """Energy of the given NVML device indices (physical indices, as nvidia-smi shows them)."""

    def __init__(self, indices: list[int] | None = None, nvml=None, sample_interval_s: float = 0.05):
        if nvml is None:
            import pynvml as nvml
        self._nvml = nvml
        nvml.nvmlInit()
        try:
            count = nvml.nvmlDeviceGetCount()
            indices = list(range(count)) if indices is None else list(indices)
            if not indices or max(indices) >= count:
                raise OSError(f"NVML sees {count} GPU(s); cannot meter GPU indices {indices}")
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
            self.devices = [
                f"GPU {i} ({_as_str(nvml.nvmlDeviceGetName(h))})" for i, h in zip(indices, self._handles, strict=True)
            ]
            try:
                self._start_mj = [nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles]
                self.source = "nvml-energy-counter"
                self.resolution_s = NVML_COUNTER_RESOLUTION_S
                self._sampler = None
            except nvml.NVMLError:
                # No energy counter (pre-Volta): integrate sampled power instead.
                self.source = "nvml-power-sampling"
                self.resolution_s = 2 * sample_interval_s
                self._sampler = _PowerSampler(nvml, self._handles, sample_interval_s)
        except Exception:
            nvml.nvmlShutdown()
            raise
        self.reason = None

    @property
    def available(self) -> bool:
        return True

    def read(self) -> float:
        if self._sampler is not None:
            return self._sampler.joules()
        now = [self._nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles]
        return sum(n - s for n, s in zip(now, self._start_mj, strict=True)) / 1000.0

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        self._nvml.nvmlShutdown()


class _PowerSampler:
    def __init__(self, nvml, handles, interval_s: float):
        self._nvml, self._handles, self._interval = nvml, handles, interval_s
        self._joules = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_t, self._last_w = time.perf_counter(), self._watts()
        self._thread = threading.Thread(target=self._run, name="decodebench-nvml-power", daemon=True)
        self._thread.start()

    def _watts(self) -> float:
        return sum(self._nvml.nvmlDeviceGetPowerUsage(h) for h in self._handles) / 1000.0

    def _sample(self) -> None:
        t, w = time.perf_counter(), self._watts()
        with self._lock:
            self._joules += 0.5 * (w + self._last_w) * (t - self._last_t)
            self._last_t, self._last_w = t, w

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def joules(self) -> float:
        self._sample()
        with self._lock:
            return self._joules

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _as_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_cuda_to_nvml(cuda_ordinals: list[int], nvml=None) -> list[int]:
    """Map CUDA device ordinals of this process to NVML indices through CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return list(cuda_ordinals)
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if all(entry.isdigit() for entry in entries):
        return [int(entries[i]) for i in cuda_ordinals]
    if nvml is None:
        import pynvml as nvml
    nvml.nvmlInit()
    try:
        by_uuid = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            uuid = _as_str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)))
            by_uuid[uuid] = i
        return [next(i for uuid, i in by_uuid.items() if uuid.startswith(entries[o])) for o in cuda_ordinals]
    finally:
        nvml.nvmlShutdown()


# DCGM's total-energy field, in millijoules since the driver loaded, one series per GPU
DCGM_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"


class DcgmExporterMeter:
    """The GPUs of another machine, through its DCGM exporter's ``/metrics`` page (summed over every GPU).

    The exporter refreshes its fields on its own schedule (``-c``, 30 s by default): windows shorter
    than ``resolution_s`` are left unmetered, like NVML's."""

    source = "dcgm-exporter"
    reason = None

    def __init__(self, url: str, resolution_s: float = 30.0):
        from decodebench.measure.prometheus import scrape

        self._url, self._scrape = url, scrape
        self.resolution_s = resolution_s
        values = scrape(url)
        series = [name for name in values if name.startswith(DCGM_ENERGY + "{")]
        if DCGM_ENERGY not in values:
            raise OSError(f"{url} has no {DCGM_ENERGY} (is it a DCGM exporter, with that field enabled?)")
        self.devices = series or [url]
        self._start = values[DCGM_ENERGY]

    @property
    def available(self) -> bool:
        return True

    def read(self) -> float:
        return (self._scrape(self._url)[DCGM_ENERGY] - self._start) / 1000

    def close(self) -> None:
        pass


def open_served_meter(base_url: str, energy_url: str | None) -> EnergyMeter:
    """The meter of a served model's GPUs: its DCGM exporter when ``energy_url`` is given, NVML over every GPU
    of this machine when the server runs here, else unavailable with the reason. Never raises."""
    from urllib.parse import urlparse

    if energy_url:
        try:
            return DcgmExporterMeter(energy_url)
        except Exception as exc:
            return UnavailableMeter(f"energy_url={energy_url} cannot be read: {exc}")
    host = urlparse(base_url).hostname or ""
    if host not in ("localhost", "127.0.0.1", "::1", "0.0.0.0"):
        return UnavailableMeter(
            f"the server at {host} is not on this machine: give energy_url=<its DCGM exporter's /metrics URL>"
        )
    try:
        return NvmlMeter(None)  # every GPU of this machine: the server's are among them
    except Exception as exc:
        return UnavailableMeter(f"the server runs on this machine, and no GPU energy counter is readable ({exc})")


def open_meter(
    device_type: str,
    cuda_ordinals: list[int] | None = None,
    rapl_root: str | os.PathLike = "/sys/class/powercap",
) -> EnergyMeter:
    """The meter for the devices that run the model: NVML for CUDA devices, RAPL for the CPU.

    Never raises: failures become an ``UnavailableMeter`` carrying the reason.
    """
    if device_type == "cuda":
        try:
            return NvmlMeter(visible_cuda_to_nvml(cuda_ordinals or [0]))
        except Exception as exc:
            return UnavailableMeter(f"the model runs on CUDA but NVML could not be read: {exc}")
    if device_type == "cpu":
        try:
            return RaplMeter(rapl_root)
        except PermissionError:
            return UnavailableMeter(
                f"the model runs on the CPU and the RAPL counters under {rapl_root} are not readable "
                "by this user (they usually need root); no GPU is in use"
            )
        except (OSError, ValueError) as exc:
            return UnavailableMeter(
                f"the model runs on the CPU and no RAPL energy counter is readable ({exc}); no GPU is in use"
            )
    return UnavailableMeter(f"no energy counter is known for device type '{device_type}'")
