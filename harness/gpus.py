"""The GPUs of this host (through NVML, in the trusted parent) and the placement of a run on one of them.

The choice itself is harness/placement.py; this module reads the host (NVML, the serving claims of
harness/gpu_lease.py) and holds the claim of the GPU chosen.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from harness.gpu_lease import ServingClaim
from harness.placement import GpuInfo, PlacementError, choose_gpu, parse_choice
from harness.worker_side.compile_policy import arch_for

log = logging.getLogger(__name__)

_RACES = 8  # another server took the GPU between the look and the claim: look again, this many times


@dataclass
class Placement:
    """Where a run goes: its GPU, and this process's claim on it (None: shared with a run that holds it)."""

    gpu: GpuInfo
    claim: ServingClaim | None
    shared: bool

    def release(self) -> None:
        if self.claim is not None:
            self.claim.release()


def list_gpus() -> list[GpuInfo]:
    """The GPUs NVML sees that $CUDA_VISIBLE_DEVICES leaves to this process, by index; [] without NVML."""
    return visible(host_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def host_gpus() -> list[GpuInfo]:
    """Every GPU NVML sees on this host, by index, whatever $CUDA_VISIBLE_DEVICES says; [] without NVML (no driver,
    no nvidia-ml-py)."""
    try:
        import pynvml  # optional: without NVML no GPU can be named, and the run goes where CUDA puts it
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        gpus = []
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(GpuInfo(index, uuid.decode() if isinstance(uuid, bytes) else str(uuid), int(memory)))
        return gpus
    except Exception as exc:  # noqa: BLE001 - ImportError or any NVMLError: no GPU can be named
        log.info("NVML cannot list the GPUs: %s", exc)
        return []


def visible(gpus: list[GpuInfo], cuda_visible: str | None) -> list[GpuInfo]:
    """The GPUs that $CUDA_VISIBLE_DEVICES leaves to this process (indices or UUIDs, or their prefixes, as CUDA
    reads them); all where it is unset. NVML itself ignores the variable."""
    if cuda_visible is None:
        return gpus
    names = [n.strip() for n in cuda_visible.split(",") if n.strip()]
    return [g for g in gpus if any(n == str(g.index) if n.isdigit() else g.uuid.lower().startswith(n.lower())
                                   for n in names)]


def place_run(gpus: list[GpuInfo], wanted: int | str | None, what: str, folder: Path | None = None) -> Placement:
    """The GPU for a run and this process's claim on it (harness/placement.py chooses; PlacementError refuses)."""
    for _ in range(_RACES):
        claims = {g.uuid: ServingClaim(g.uuid, what, folder) for g in gpus}
        taken = {uuid for uuid, claim in claims.items() if claim.is_taken()}
        gpu, shared = choose_gpu(gpus, wanted, taken)
        claim = claims[gpu.uuid]
        if claim.try_take():
            return Placement(gpu, claim, shared=False)
        if shared:
            return Placement(gpu, None, shared=True)
        # taken since the look (another server starting at the same moment): look again
    raise PlacementError("could not claim a GPU: other servers kept taking the free ones")


def placement_for(gpus: list[GpuInfo], choice: int | str | None, what: str,
                  own_uuid: str | None = None) -> Placement | None:
    """Where a command's GPU work goes: `choice` (`--gpu`'s text or value), else the GPU `own_uuid` names (a run's
    own, where it is here), else a free one; None where NVML names no GPU and none was asked for (CUDA's device 0,
    as on a one-GPU host). PlacementError: a GPU asked for that is not here, or cannot be named."""
    wanted = parse_choice(choice) if isinstance(choice, str) else choice
    if not gpus:
        if wanted is not None:
            raise PlacementError(f"--gpu {choice}: no GPU can be named here (NVML lists none)")
        return None
    if wanted is None and own_uuid is not None and any(g.uuid == own_uuid for g in gpus):
        wanted = own_uuid
    return place_run(gpus, wanted, what)


def nvml_arch(uuid: str | None = None) -> str | None:
    """The NVRTC arch (sm_XY) of the GPU `uuid` names, else the one arch of every GPU left to this process, read
    from NVML without a CUDA context (so with no GPU worker started); None without NVML, without a GPU, or where
    the GPUs differ (only the one a run is placed on can tell then)."""
    try:
        import pynvml  # optional, as in list_gpus
        pynvml.nvmlInit()
        uuids = [uuid] if uuid is not None else [g.uuid for g in list_gpus()]
        archs = {arch_for(*pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByUUID(u)))
                 for u in uuids}
    except Exception as exc:  # noqa: BLE001 - ImportError or any NVMLError: the arch is not known ahead
        log.info("NVML cannot tell the GPUs' arch: %s", exc)
        return None
    return archs.pop() if len(archs) == 1 else None
