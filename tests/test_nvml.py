"""What the NVML readings around a timing imply: throttling, a low clock, other processes."""

import sys
import types

from harness.nvml import GpuState, Nvml, decode_reasons, driver_build, judge


def test_throttle_masks_decode_to_names_and_keep_unknown_bits():
    assert decode_reasons(0) == []
    assert decode_reasons(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert decode_reasons(0x8 | 0x10000) == ["hw_slowdown", "unknown_0x10000"]


def test_a_quiet_gpu_used_only_by_the_referee_gives_no_warning():
    before = GpuState(sm_clock_mhz=1980, max_sm_clock_mhz=1980, throttle=["gpu_idle"], processes=[11, 12])
    after = GpuState(sm_clock_mhz=1965, max_sm_clock_mhz=1980, throttle=[], processes=[11, 12])
    watch = judge(before, after, [11, 12])
    assert watch.warnings == [] and watch.other_processes == []


def test_power_or_thermal_throttling_is_a_warning_and_benign_reasons_are_not():
    watch = judge(GpuState(throttle=["sync_boost"]), GpuState(throttle=["sw_power_cap", "hw_thermal_slowdown"]), [])
    assert watch.warnings == ["the GPU was throttled during the timing (hw_thermal_slowdown, sw_power_cap): "
                              "samples may be slow"]
    assert judge(GpuState(throttle=["applications_clocks_setting", "display_clock_setting"]), GpuState(), []).warnings == []


def test_an_sm_clock_under_80_percent_of_its_maximum_is_a_warning_unless_the_gpu_was_idle():
    low = GpuState(sm_clock_mhz=1200, max_sm_clock_mhz=1980)
    assert judge(low, low, []).warnings == ["the SM clock read 1200 MHz, under 80% of its 1980 MHz maximum"]
    idle = GpuState(sm_clock_mhz=345, max_sm_clock_mhz=1980, throttle=["gpu_idle"])
    assert judge(idle, GpuState(sm_clock_mhz=1980, max_sm_clock_mhz=1980), []).warnings == []


def test_another_process_on_the_gpu_is_named():
    watch = judge(GpuState(processes=[11, 12, 999]), GpuState(processes=[11, 12]), [11, 12])
    assert watch.other_processes == [999]
    assert watch.warnings == ["other processes held a context on the GPU during the timing (pids 999): "
                              "if they ran work, comparisons made meanwhile are noise"]


def test_pids_of_another_namespace_are_judged_by_their_count():
    # NVML in a container may list host pids: none is ours, so only a surplus means another user.
    assert judge(GpuState(processes=[70001, 70002]), GpuState(processes=[70001, 70002]), [11, 12]).warnings == []
    crowded = judge(GpuState(processes=[70001, 70002, 70003]), GpuState(), [11, 12])
    assert crowded.other_processes == [70001, 70002, 70003] and len(crowded.warnings) == 1


def test_without_nvml_every_reading_is_empty_and_says_why(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    nvml = Nvml("00000000:01:00.0")
    assert not nvml.available and "NVML unavailable" in nvml.note
    assert nvml.read() == GpuState()


def test_the_maximum_sm_clock_is_read_once_and_the_current_state_every_time(monkeypatch):
    import sys
    import types

    calls = {"max": 0, "clock": 0}
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None, nvmlDeviceGetHandleByPciBusId=lambda bus: "gpu",
        nvmlDeviceGetMaxClockInfo=lambda h, kind: calls.__setitem__("max", calls["max"] + 1) or 1980,
        nvmlDeviceGetClockInfo=lambda h, kind: calls.__setitem__("clock", calls["clock"] + 1) or (1755 if kind == 0 else 2619),
        nvmlDeviceGetTemperature=lambda h, kind: 40, nvmlDeviceGetPowerUsage=lambda h: 120000,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0, nvmlDeviceGetComputeRunningProcesses=lambda h: [])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = Nvml("00000000:01:00.0")
    states = [nvml.read() for _ in range(3)]
    assert all(s.max_sm_clock_mhz == 1980 and s.sm_clock_mhz == 1755 for s in states)
    assert calls == {"max": 1, "clock": 6}


def _fake_pynvml(monkeypatch, version=None, error=None):
    def get_version():
        if error:
            raise error
        return version
    module = types.SimpleNamespace(nvmlInit=lambda: None, nvmlSystemGetDriverVersion=get_version)
    monkeypatch.setitem(sys.modules, "pynvml", module)


def test_the_driver_build_is_read_as_text_whatever_the_binding_returns(monkeypatch):
    _fake_pynvml(monkeypatch, version=b"580.159.04")  # older bindings return bytes
    assert driver_build() == "580.159.04"
    _fake_pynvml(monkeypatch, version="580.95.05")
    assert driver_build() == "580.95.05"


def test_without_a_driver_its_build_is_unknown(monkeypatch):
    _fake_pynvml(monkeypatch, error=RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED"))
    assert driver_build() is None
