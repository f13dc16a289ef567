"""An environment fingerprint: what a latency depends on besides the kernel.

The GPU (model, UUID, SM count), how it is set (clock ceilings, a pinned application clock, the power
limit, ECC), the software under the kernel (driver build and the CUDA it supports, NVRTC, cuda-bindings) and
the referee itself (its version and the sha256 of its modules). An approval records the fingerprint of the
run it was taken from; the guard captures this machine's and lists the differences beside any change as its
likely cause. Where there is no GPU (or no NVML) the GPU's fields are None: absent, not guessed.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.nvml import Nvml, driver_build
from harness.worker_side.nvrtc import nvrtc_version
from server.lock import digest, referee_source

# The fields that make a latency comparable across machines: a difference in one of these is a likely cause
# of a change in latency. The referee's modules come last: they change what is measured, not the hardware.
COMPARED = ("gpu", "gpu_uuid", "sm_count", "max_sm_clock_mhz", "max_memory_clock_mhz", "application_sm_clock_mhz",
            "power_limit_w", "ecc_enabled", "driver", "driver_cuda_version", "nvrtc", "cuda_bindings",
            "referee_version", "referee_source_sha256")


class Difference(BaseModel):
    """One field of two fingerprints that differs."""

    model_config = ConfigDict(frozen=True)

    field: str
    before: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.field}: {self.before!r} -> {self.now!r}"


class Fingerprint(BaseModel):
    """The environment a latency was measured in."""

    model_config = ConfigDict(frozen=True)

    gpu: str | None = None
    gpu_uuid: str | None = None
    sm_count: int | None = None
    sm_clock_khz: int | None = None  # the driver's attribute, as the run's environment names it
    max_sm_clock_mhz: int | None = None
    max_memory_clock_mhz: int | None = None
    application_sm_clock_mhz: int | None = None
    power_limit_w: float | None = None
    ecc_enabled: bool | None = None
    driver: str | None = None  # the build, e.g. 580.159.04
    driver_cuda_version: str | None = None  # the CUDA the driver supports, e.g. 13.0
    nvrtc: str | None = None
    cuda_bindings: str | None = None
    referee_version: str | None = None
    referee_source_sha256: str | None = None
    referee_source: dict[str, str] = {}  # module -> sha256, to name which modules changed

    def differences(self, now: Fingerprint) -> list[Difference]:
        """The compared fields that differ; a field unknown on either side is no difference (not measured is
        not changed)."""
        found = []
        for name in COMPARED:
            before, after = getattr(self, name), getattr(now, name)
            if before is not None and after is not None and before != after:
                found.append(Difference(field=name, before=before, now=after))
        return found

    def changed_modules(self, now: Fingerprint) -> list[str]:
        """The referee's modules whose sha256 differs (added and removed ones included)."""
        names = set(self.referee_source) | set(now.referee_source)
        return sorted(n for n in names if self.referee_source.get(n) != now.referee_source.get(n))

    def same_hardware(self, now: Fingerprint) -> bool:
        """The same board, set the same way: where a latency may be compared in milliseconds, not only as a ratio."""
        hardware = {"gpu", "gpu_uuid", "sm_count", "max_sm_clock_mhz", "application_sm_clock_mhz", "power_limit_w",
                    "ecc_enabled"}
        return self.gpu is not None and not any(d.field in hardware for d in self.differences(now))


def referee_fingerprint() -> dict[str, Any]:
    """The referee's version and module hashes (the same hashes a run's lock.json holds)."""
    source = referee_source()
    return {"referee_version": _version("kernel-referee"), "referee_source_sha256": digest(source),
            "referee_source": source}


def from_environment(environment: dict[str, Any], *, referee: dict[str, Any] | None = None) -> Fingerprint:
    """A fingerprint from a run's environment facts (lock.json `environment`, an executor's start()), with NVML's
    board readings where the facts carry them (`board`) and the referee's (`referee`, default this one's)."""
    board = environment.get("board") or {}
    sm_clock_khz = environment.get("sm_clock_khz")
    return Fingerprint(
        gpu=environment.get("gpu"), gpu_uuid=environment.get("gpu_uuid"), sm_count=environment.get("sm_count"),
        sm_clock_khz=sm_clock_khz,
        max_sm_clock_mhz=board.get("max_sm_clock_mhz")
        or (environment.get("gpu_state") or {}).get("max_sm_clock_mhz"),
        max_memory_clock_mhz=board.get("max_memory_clock_mhz"),
        application_sm_clock_mhz=board.get("application_sm_clock_mhz"),
        power_limit_w=board.get("power_limit_w"), ecc_enabled=board.get("ecc_enabled"),
        driver=environment.get("driver"), driver_cuda_version=environment.get("driver_cuda_version"),
        nvrtc=environment.get("nvrtc"), cuda_bindings=environment.get("cuda_bindings"),
        **(referee if referee is not None else referee_fingerprint()))


def run_fingerprint(environment: dict[str, Any], *, referee: dict[str, Any] | None = None) -> Fingerprint:
    """The fingerprint of a run's environment (lock.json `environment`). A run's facts do not hold the board's
    settings (clock ceilings, power limit, ECC): they are read now where that same board (its UUID) is on this
    machine, and left None elsewhere."""
    uuid = environment.get("gpu_uuid")
    if uuid and "board" not in environment:
        board = Nvml(uuid=uuid).board()
        if board.uuid == uuid:
            environment = {**environment, "board": board.model_dump()}
    return from_environment(environment, referee=referee)


def capture(facts: dict[str, Any] | None = None, *, gpu_uuid: str | None = None) -> Fingerprint:
    """This machine's fingerprint: NVML's readings of the GPU `gpu_uuid` (or the first), over `facts` (an
    executor's start(), which adds the SM count, NVRTC and the driver's CUDA from the GPU worker). Without a GPU
    or NVML, the GPU's fields are None; the software's are still read."""
    facts = dict(facts or {})
    nvml = Nvml(uuid=gpu_uuid or facts.get("gpu_uuid"))
    board = nvml.board()
    facts["board"] = board.model_dump()
    facts.setdefault("gpu", board.name)
    facts.setdefault("gpu_uuid", board.uuid)
    facts.setdefault("driver_cuda_version", board.driver_cuda_version)
    facts.setdefault("driver", driver_build() if nvml.available else None)
    facts.setdefault("nvrtc", _nvrtc_version())
    facts.setdefault("cuda_bindings", _version("cuda-bindings"))
    return from_environment(facts)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvrtc_version() -> str | None:
    try:
        return nvrtc_version()
    except Exception:  # noqa: BLE001 - an NVRTC that cannot load has no version to record
        return None
