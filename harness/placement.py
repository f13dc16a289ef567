"""Which GPU of the host a run goes on: the one asked for (`--gpu N|UUID`), else a free one.

Pure: given the GPUs present and the UUIDs that a serving run already holds (harness/gpu_lease.py ServingClaim), it
chooses one or refuses with one line. A GPU is named by its UUID everywhere after this choice (the lock,
the lease, the workers' CUDA_VISIBLE_DEVICES), never by an ordinal that another process numbers otherwise;
the index is nvidia-smi's (NVML's), for people.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of the host: NVML's index, its UUID (GPU-...), its memory."""

    index: int
    uuid: str
    memory_bytes: int | None = None

    def describe(self) -> str:
        return f"GPU {self.index} ({self.uuid})"


class PlacementError(ValueError):
    """The GPU asked for is not on this host, or no GPU can be named (a usage error: exit 2)."""


def parse_choice(text: str) -> int | str:
    """`--gpu`'s value: an index (a whole number) or a UUID (GPU-...), as nvidia-smi -L prints them."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if text.upper().startswith(("GPU-", "MIG-")):
        return text
    raise PlacementError(f"--gpu {text!r} is neither a GPU index (0, 1, ...) nor a UUID (GPU-...), as nvidia-smi -L "
                         "prints them")


def choose_gpu(gpus: list[GpuInfo], wanted: int | str | None, taken: set[str]) -> tuple[GpuInfo, bool]:
    """(the GPU for a run, whether it is shared with a serving run that holds it already).

    `wanted` (an index or a UUID) is taken as asked, free or not. Without it, the first GPU in index order
    that no serving run holds; if every one is held, the first GPU present, shared (its timings still take
    turns through the timing lease, harness/gpu_lease.py), so that one GPU serves several runs as before."""
    if not gpus:
        raise PlacementError("no GPU is listed on this host (NVML found none)")
    ordered = sorted(gpus, key=lambda g: g.index)
    if wanted is not None:
        chosen = _find(ordered, wanted)
        return chosen, chosen.uuid in taken
    for gpu in ordered:
        if gpu.uuid not in taken:
            return gpu, False
    return ordered[0], True


def _find(gpus: list[GpuInfo], wanted: int | str) -> GpuInfo:
    if isinstance(wanted, int):
        found = [g for g in gpus if g.index == wanted]
    else:
        found = [g for g in gpus if g.uuid.lower() == wanted.lower()]
    if not found:
        present = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
        raise PlacementError(f"there is no GPU {wanted} on this host; present: {present}")
    return found[0]
