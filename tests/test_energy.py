"""Energy readings (labkit.core.energy): RAPL on a fake /sys/class/powercap tree, NVML through a fake pynvml."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from labkit.core import energy


def zone(root: Path, name: str, label: str, uj: int, max_uj: int | None = 262_143_328_850) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{uj}\n")
    if max_uj is not None:
        (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


@pytest.fixture
def powercap(tmp_path):
    """Two sockets, each with a core subzone, as a two-socket Linux server shows them."""
    root = tmp_path / "powercap"
    (root / "intel-rapl").mkdir(parents=True)  # the control type: no energy_uj, not a zone
    zone(root, "intel-rapl:0", "package-0", 1_000_000)
    zone(root, "intel-rapl:0:0", "core", 500_000)
    zone(root, "intel-rapl:1", "package-1", 7_000_000)
    zone(root, "intel-rapl:1:0", "dram", 100)
    return root


def bump(root: Path, zone_name: str, uj: int) -> None:
    (root / zone_name / "energy_uj").write_text(f"{uj}\n")


def test_rapl_domains_lists_zones_with_counters(powercap):
    found = energy.rapl_domains(powercap)
    assert [d.zone for d in found] == ["intel-rapl:0", "intel-rapl:0:0", "intel-rapl:1", "intel-rapl:1:0"]
    assert [d.name for d in found] == ["package-0", "core", "package-1", "dram"]
    assert [d.top_level for d in found] == [True, False, True, False]
    assert all(d.readable and d.max_energy_range_uj == 262_143_328_850 for d in found)
    assert [d.name for d in energy.counted_domains(found)] == ["package-0", "package-1"]
    assert energy.rapl_unavailable(powercap) == ""


def test_the_meter_sums_the_packages_and_labels_its_source(powercap):
    with energy.EnergyMeter("rapl", root=powercap) as meter:
        bump(powercap, "intel-rapl:0", 1_000_000 + 3_000_000)  # +3 J
        bump(powercap, "intel-rapl:0:0", 500_000 + 2_000_000)  # inside package-0: not added again
        bump(powercap, "intel-rapl:1", 7_000_000 + 1_500_000)  # +1.5 J
    r = meter.reading
    assert r.source == "rapl" and r.joules == pytest.approx(4.5) and not r.reason
    assert r.domains == pytest.approx({"package-0": 3.0, "package-1": 1.5})
    assert "package-0, package-1" in r.method and "not DRAM" in r.method
    assert r.seconds > 0 and r.watts == pytest.approx(4.5 / r.seconds)


def test_a_meter_entered_twice_reads_each_block(powercap, tmp_path):
    meter = energy.EnergyMeter("rapl", root=tmp_path / "nowhere")
    with meter:
        pass
    assert meter.reading.joules is None
    meter.root = powercap
    with meter:
        bump(powercap, "intel-rapl:0", 1_000_000 + 250_000)
    assert meter.reading.joules == pytest.approx(0.25) and not meter.reading.reason


def test_a_counter_that_wraps_is_unwrapped_with_max_energy_range(tmp_path):
    root = tmp_path / "powercap"
    zone(root, "intel-rapl:0", "package-0", 999_000, max_uj=1_000_000)
    with energy.EnergyMeter("rapl", root=root) as meter:
        bump(root, "intel-rapl:0", 4_000)  # 999 000 → 1 000 000 (wrap) → 4 000: 5 000 µJ
    assert meter.reading.joules == pytest.approx((1_000_000 - 999_000 + 4_000) / 1e6)
    assert energy.rapl_delta_uj(10, 30, None) == 20
    assert energy.rapl_delta_uj(900, 100, 1000) == 200
    assert energy.rapl_delta_uj(900, 100, None) is None


def test_a_wrap_without_a_known_range_is_a_reason_not_a_number(tmp_path):
    root = tmp_path / "powercap"
    zone(root, "intel-rapl:0", "package-0", 999_000, max_uj=None)
    with energy.EnergyMeter("rapl", root=root) as meter:
        bump(root, "intel-rapl:0", 4_000)
    assert meter.reading.joules is None and "wrapped" in meter.reading.reason


def test_absent_powercap_says_rapl_is_not_exposed(tmp_path):
    _, r = energy.measure_energy(lambda: None, source="rapl", root=tmp_path / "nowhere")
    assert r.joules is None and r.watts is None and r.source == "rapl"
    assert r.reason.startswith("RAPL not exposed here") and r.seconds >= 0
    empty = tmp_path / "empty"
    (empty / "intel-rapl").mkdir(parents=True)
    assert energy.rapl_domains(empty) == []
    assert "RAPL not exposed in this VM" in energy.rapl_unavailable(empty)


def test_an_unreadable_counter_says_why(powercap, monkeypatch):
    real = energy._read_int

    def root_only(path: Path) -> int:  # what a non-root reader meets on Linux ≥ 5.10 (mode 0400)
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(energy, "_read_int", root_only)
    found = energy.rapl_domains(powercap)
    assert found and not any(d.readable for d in found) and "root only since Linux 5.10" in found[0].reason
    result, r = energy.measure_energy(lambda: 42, source="rapl", root=powercap)
    assert result == 42 and r.joules is None and "permission denied" in r.reason


def test_the_auto_source_follows_the_device(powercap):
    with energy.EnergyMeter("auto", device="cpu", root=powercap) as meter:
        pass
    assert meter.reading.source == "rapl" and meter.reading.joules == 0.0


# --------------------------------------------------------------------------------------------------- NVML


class FakeNVML(types.ModuleType):
    NVML_ERROR_NOT_SUPPORTED = 3

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, energy_mj=None, power_mw=250_000.0):
        super().__init__("pynvml")
        self.energy_mj = energy_mj
        self.power_mw = power_mw
        self.calls: list[str] = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls.append(f"index {index}")
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(f"uuid {uuid}")
        return ("handle", uuid)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if self.energy_mj is None:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        value = self.energy_mj
        self.energy_mj += 12_500  # 12.5 J between two reads
        return value

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.power_mw


@pytest.fixture
def fake_nvml(monkeypatch):
    def install(**kw):
        fake = FakeNVML(**kw)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        return fake
    return install


def test_nvml_energy_counter_before_and_after(fake_nvml):
    fake = fake_nvml(energy_mj=1_000_000)
    _, r = energy.measure_energy(lambda: None, source="nvml")
    assert r.source == "nvml-energy" and r.joules == pytest.approx(12.5) and "total-energy counter" in r.method
    assert fake.calls[0] == "init" and fake.calls[-1] == "shutdown" and "index 0" in fake.calls


def test_nvml_without_an_energy_counter_integrates_sampled_power(fake_nvml):
    import time

    fake = fake_nvml(energy_mj=None)
    watts = iter([100.0, 300.0] * 1000)  # alternating readings, every 10 ms
    fake.nvmlDeviceGetPowerUsage = lambda handle: next(watts) * 1e3
    _, r = energy.measure_energy(lambda: time.sleep(0.2), source="nvml", interval_s=0.01)
    assert r.source == "nvml-power" and "sampled" in r.method and fake.calls[-1] == "shutdown"
    assert 100.0 * r.seconds < r.joules < 300.0 * r.seconds  # the mean of what was sampled, × the block's seconds
    fake_nvml(energy_mj=None, power_mw=200_000.0)  # a constant 200 W
    _, r = energy.measure_energy(lambda: time.sleep(0.05), source="nvml", interval_s=0.01)
    assert r.joules == pytest.approx(200.0 * r.seconds) and r.watts == pytest.approx(200.0)


def test_nvml_missing_or_failing_is_a_reason(fake_nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    _, r = energy.measure_energy(lambda: None, source="nvml")
    assert r.joules is None and "nvidia-ml-py not installed" in r.reason
    fake = fake_nvml(energy_mj=5)

    def no_driver():
        raise fake.NVMLError(9)

    fake.nvmlInit = no_driver
    _, r = energy.measure_energy(lambda: None, source="nvml")
    assert r.joules is None and r.reason.startswith("NVML not usable")


def test_estimates_are_labelled_and_per_token_arithmetic():
    est = energy.estimate_joules(65, 12.0)
    assert est.source == "estimate" and est.joules == 65 * 12.0 and "not measured" in est.method
    assert energy.joules_per_token(est, 390) == pytest.approx(65 * 12.0 / 390)
    assert energy.joules_per_token(3.0, 4) == 0.75
    missing = energy.EnergyReading("rapl", None, 1.0, "RAPL", "RAPL not exposed here")
    with pytest.raises(ValueError, match="RAPL not exposed here.*estimate_joules"):
        energy.joules_per_token(missing, 10)
    with pytest.raises(ValueError, match="tokens=0"):
        energy.joules_per_token(3.0, 0)
    with pytest.raises(ValueError, match="joules=-1"):
        energy.joules_per_token(-1, 3)
    with pytest.raises(ValueError, match="watts=0"):
        energy.estimate_joules(0, 3)
    with pytest.raises(ValueError, match="source='gpu'"):
        energy.EnergyMeter("gpu")
