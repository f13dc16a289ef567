"""`guard STORE --ray [ADDRESS]`: the approvals fanned out over a Ray cluster, one task each, asking for one GPU.

Each task gets its approval's files and the store's trusted keys as bytes (the nodes need not share a file
system), writes them into a store of its own, verifies it again (guard/store.py), and runs the same guard step
as a single host does (guard/step.py) on the GPU Ray gave it. Ray's GPU count is a reservation, not isolation:
the step still takes the GPU's host-wide lease (harness/gpu_lease.py) around its rounds, so a referee process
outside Ray, or a second Ray worker on a node that lies about its GPUs, never times beside it. Each result names
its node and that node's fingerprint; the caller merges them into one history, JUnit, JSON and HTML
(guard/run.py `finish`).

Ray is an optional extra (`kernel-referee[fleet]`), imported here only, and only when a fleet is asked for:
`kernel-referee guard` without `--ray` runs without it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from guard.measure import MakeExecutor, local_executor
from guard.step import StepResult, guard_approval
from guard.store import APPROVALS, LoadedApproval, approval_dir, keys_dir, load_approval
from guard.verdict import VerdictSettings

Say = Callable[[str], None]


class NoFleetGpu(Exception):
    """The Ray cluster offers no resource the approvals' tasks ask for: they would wait for ever."""


def guard_fleet(options, loaded: list[LoadedApproval], say: Say) -> list[StepResult]:
    """Every approval as a Ray task on the cluster at `options.ray` (guard/run.py GuardOptions), results in the
    approvals' order. Connects (or starts a local cluster for "auto" where none runs) and leaves it as found."""
    import ray  # the optional extra kernel-referee[fleet]: loaded only when a fleet is asked for
    started = not ray.is_initialized()
    if started:
        ray.init(address=None if options.ray == "auto" else options.ray, include_dashboard=False,
                 log_to_driver=False)
    try:
        _check_resources(options.fleet_resources)
        keys = _files(keys_dir(options.store))
        remote = ray.remote(**options.fleet_resources)(_guard_on_node)
        pending = []
        for approval in loaded:
            make = options.make_executor(approval) if options.make_executor is not None else None
            pending.append(remote.remote(approval.name, _files(approval.folder), keys, make, options.settings,
                                         options.confine, options.gpu))
            say(f"{approval.name}: sent to the Ray cluster")
        return ray.get(pending)
    finally:
        if started:
            ray.shutdown()


def _check_resources(asked: dict) -> None:
    """Refuse a cluster without what each task asks for (its GPUs, or the custom resource standing in for them)."""
    import ray  # the optional extra kernel-referee[fleet], loaded by guard_fleet before this

    have = ray.cluster_resources()
    wanted = {"GPU": asked["num_gpus"]} if "num_gpus" in asked else {}
    wanted.update(asked.get("resources") or {})
    missing = [f"{name} (asks {count:g}, the cluster has {have.get(name, 0):g})" for name, count in wanted.items()
               if have.get(name, 0) < count]
    if missing:
        raise NoFleetGpu(f"the Ray cluster has too little of {', '.join(missing)}: no approval can be placed")


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by path relative to it."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _guard_on_node(name: str, files: dict[str, bytes], keys: dict[str, bytes], make: MakeExecutor | None,
                   settings: VerdictSettings, confine: bool, gpu: str | None) -> StepResult:
    """On the node: the approval written into a store of its own, verified there, guarded on the node's GPU."""
    with tempfile.TemporaryDirectory(prefix="kernel-referee-guard-") as scratch:
        store = Path(scratch) / "store"
        for folder, contents in ((keys_dir(store), keys), (approval_dir(store, name), files)):
            for relative, data in contents.items():
                (folder / relative).parent.mkdir(parents=True, exist_ok=True)
                (folder / relative).write_bytes(data)
        (store / APPROVALS).mkdir(parents=True, exist_ok=True)
        loaded = load_approval(store, name)  # verified again, on the node, from the bytes it got
        if make is None:
            make = local_executor(name, confine, _node_gpu(gpu))
        return guard_approval(loaded, make, settings)


def _node_gpu(asked: str | None) -> str | None:
    """The GPU Ray gave this task (its first visible one), unless `--gpu` named one."""
    import ray  # the optional extra kernel-referee[fleet]: this runs in a Ray worker

    if asked is not None:
        return asked
    ids = ray.get_gpu_ids()
    return str(int(ids[0])) if ids else None
