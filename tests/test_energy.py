"""Energy meters on fake counters where the real ones cannot be read here (no GPU, no RAPL)."""

from __future__ import annotations

import time

import pytest

from decodebench.measure.energy import NvmlMeter, RaplMeter, UnavailableMeter, open_meter, visible_cuda_to_nvml


def write_zone(root, name, energy_uj, max_uj=1_000_000, label="package-0"):
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    (zone / "name").write_text(label)
    return zone


def test_rapl_sums_package_zones_ignores_subzones_and_handles_wraparound(tmp_path):
    write_zone(tmp_path, "intel-rapl:0", 900_000)
    write_zone(tmp_path, "intel-rapl:1", 100, label="package-1")
    write_zone(tmp_path, "intel-rapl:0:0", 5, label="core")  # sub-zone: part of package 0
    meter = RaplMeter(tmp_path)
    assert meter.available and meter.source == "rapl"
    assert meter.devices == ["intel-rapl:0 (package-0)", "intel-rapl:1 (package-1)"]
    assert meter.read() == 0.0
    # package 0 wraps: 900_000 -> 1_000_000 (max) -> 0 -> 50_000 = 150_001 uJ; package 1: +2_000_000 uJ
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("50000")
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text(str(100 + 2_000_000))
    (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text("999999")
    assert meter.read() == pytest.approx((150_001 + 2_000_000) / 1e6)


def test_rapl_without_zones_or_permission_is_unavailable_with_a_reason(tmp_path, monkeypatch):
    meter = open_meter("cpu", rapl_root=tmp_path)
    assert isinstance(meter, UnavailableMeter)
    assert "RAPL" in meter.reason and "no GPU is in use" in meter.reason
    with pytest.raises(RuntimeError, match="unavailable"):
        meter.read()

    write_zone(tmp_path, "intel-rapl:0", 1)

    def denied(self, *args, **kwargs):
        raise PermissionError("denied")

    monkeypatch.setattr(type(tmp_path), "read_text", denied)
    meter = open_meter("cpu", rapl_root=tmp_path)
    assert not meter.available and "not readable" in meter.reason


class FakeNvml:
    """Stands in for pynvml where no NVIDIA GPU exists; mimics its counters and errors."""

    class NVMLError(Exception):
        pass

    def __init__(self, energy_counter=True, gpus=2):
        self.energy_mj = [1_000_000 for _ in range(gpus)]
        self.power_mw = [100_000 for _ in range(gpus)]
        self.energy_counter = energy_counter
        self.gpus = gpus
        self.initialized = 0

    def nvmlInit(self):
        self.initialized += 1

    def nvmlShutdown(self):
        self.initialized -= 1

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU"

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}aaaa"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.energy_counter:
            raise self.NVMLError("Not Supported")
        return self.energy_mj[handle]

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.power_mw[handle]


def test_nvml_energy_counter_difference_in_joules_for_selected_gpus():
    nvml = FakeNvml()
    meter = NvmlMeter([1], nvml=nvml)
    assert meter.source == "nvml-energy-counter" and meter.devices == ["GPU 1 (Fake GPU)"]
    nvml.energy_mj[0] += 999_000  # another GPU's work is not ours
    nvml.energy_mj[1] += 2_500
    assert meter.read() == pytest.approx(2.5)
    meter.close()
    assert nvml.initialized == 0


def test_nvml_without_energy_counter_integrates_sampled_power():
    nvml = FakeNvml(energy_counter=False, gpus=1)
    meter = NvmlMeter([0], nvml=nvml, sample_interval_s=0.01)
    assert meter.source == "nvml-power-sampling"
    start = time.perf_counter()
    time.sleep(0.2)
    joules = meter.read()
    elapsed = time.perf_counter() - start
    meter.close()
    # constant 100 W: the integral is 100 W times the elapsed time (sampling error aside)
    assert joules == pytest.approx(100 * elapsed, rel=0.2)


def test_nvml_rejects_gpus_it_cannot_see():
    with pytest.raises(OSError, match="cannot meter"):
        NvmlMeter([3], nvml=FakeNvml(gpus=2))


def test_cuda_visible_devices_maps_ordinals_to_nvml_indices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert visible_cuda_to_nvml([0, 1]) == [2, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1")
    assert visible_cuda_to_nvml([0], nvml=FakeNvml()) == [1]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_cuda_to_nvml([0, 1]) == [0, 1]


def test_this_machine_reports_energy_as_unavailable_or_measured_never_guessed():
    meter = open_meter("cpu")
    if meter.available:
        assert meter.source == "rapl" and meter.read() >= 0
    else:
        assert meter.reason and meter.source == "unavailable"
    meter.close()
