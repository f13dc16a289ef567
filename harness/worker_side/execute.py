"""The GPU worker's "run" and "draw_run" jobs (the timed "time" job is timed_loop.py).

Runs inside the worker process only. It judges nothing: it returns raw outputs (or, for outputs judged on
the device, their handles: harness/worker_side/device_judging.py), guard bands and input hashes, and the
parent decides (harness/jobs.py, harness/referee.py).
"""

from __future__ import annotations

import numpy as np

from harness.worker_side import device_judging, fresh_inputs, gpu
from harness.worker_side.buffers import digests_later, pack_outputs, run_slots
from harness.worker_side.job import Job
from harness.worker_side.messages import DrawRunJob, RunJob
from harness.worker_side.resident import Staging
from harness.worker_side.utility_kernels import Utilities
from sandbox.answers import Status


def run_job(context: gpu.Context, header: RunJob, blobs: list[bytes],
        utilities: Utilities | None = None) -> tuple[dict, list[bytes]]:
    """One launch per poison on the same inputs; the outputs of each, then the evidence. With
    "hold_outputs" (a candidate judged on the device) the outputs stay here and their IPC handles go back;
    with "keep_as" (the reference) the first run's outputs stay here as the expected outputs of that key."""
    if utilities is not None:
        utilities.begin()
    job = Job(context, header, blobs[0], sets=1, resident=utilities.resident if utilities is not None else None)
    on_device = header.get("hold_outputs") or header.get("keep_as")
    firsts: list[gpu.Allocation] = []
    try:
        job.upload_inputs(0, blobs[1:])
        if header.get("draw_key") is not None:  # a large case's inputs, drawn here once for every launch
            job.draw(utilities, 0, header["draw_key"], 0)
        outputs: list[np.ndarray] = []
        poisons = header["poisons"]
        for number, byte in enumerate(poisons, 1):
            job.poison(0, byte)
            job.launch(0)
            context.wait(header.get("launch_limit_s"), f"launch {number} of {len(poisons)}")
            if not on_device:
                outputs += job.read_outputs(0)
            elif number == 1:
                firsts = device_judging.snapshot(job.outputs(0), context.stream,
                                                 lambda nbytes: utilities.resident.making_room(gpu.Allocation, nbytes))
        output_hashes = digests_later(outputs)  # hashed while the inputs are read back and checked
        staging = utilities.staging if utilities is not None else Staging()
        hashes, guards = job.evidence(staging.take(job.input_bytes()))
        job.keep_inputs(hashes)
        gpu_busy_ms = utilities.finish([])[1] if utilities is not None else None
        resident = utilities.resident.keys() if utilities is not None else []
        base = {"status": Status.OK, "input_sha256": hashes, "gpu_busy_ms": gpu_busy_ms, "resident_inputs": resident}
        if header.get("draw_key") is not None:
            base["changed_inputs"] = _changed_draws(job, utilities, header["draw_key"])
        if header.get("hold_outputs"):
            fields = device_judging.hold(job, firsts, utilities.held)
            if fields["held_outputs"] is not None:
                firsts = []  # held until the next job
            return {**base, **fields}, guards
        if header.get("keep_as"):
            fields = device_judging.keep(job, firsts, header, utilities)
            firsts = []  # kept as the expected outputs
            return {**base, **fields}, guards
        fields, sent = pack_outputs(outputs, run_slots(len(header["poisons"]), len(job.outputs(0))), {},
                                    output_hashes())
        return {**base, **fields}, sent + guards
    finally:
        for allocation in firsts:  # not handed on: a job that failed
            allocation.free()
        job.close()


def draw_run_job(context: gpu.Context, header: DrawRunJob, blobs: list[bytes],
             utilities: Utilities) -> tuple[dict, list[bytes]]:
    """The reference's outputs for inputs drawn on the device: one launch per launch number in
    header["draws"]["launches"], each on the inputs that launch of a time job drew with the same key
    (harness/worker_side/fresh_inputs.py). The expected outputs of a timing's audited launches. With
    "keep_as", each launch's outputs stay here, kept as "KEEP_AS/LAUNCH" (harness/worker_side/device_judging.py)."""
    utilities.begin()
    job = Job(context, header, blobs[0], sets=1, resident=utilities.resident)
    kept: list[dict] = []
    try:
        job.upload_inputs(0, blobs[1:])
        key, outputs = header["draws"]["key"], []
        for launch in header["draws"]["launches"]:
            job.draw(utilities, 0, key, launch)
            job.poison(0, header["poisons"][0])
            job.launch(0)
            context.synchronize()
            if header.get("keep_as"):
                kept.append(device_judging.keep_launch(job, f"{header['keep_as']}/{launch}", header["poisons"][0],
                                                       utilities))
            else:
                outputs += job.read_outputs(0)
        output_hashes = digests_later(outputs)
        hashes, guards = job.evidence(utilities.staging.take(job.input_bytes()))
        job.keep_inputs(hashes)
        base = {"status": Status.OK, "input_sha256": hashes, "gpu_busy_ms": utilities.finish([])[1],
                "resident_inputs": utilities.resident.keys()}
        if header.get("keep_as"):
            return {**base, "kept": kept, "output_sha256": [], "outputs_sent": 0}, guards
        fields, sent = pack_outputs(outputs, [f"{launch}/{j}" for launch in header["draws"]["launches"]
                                              for j in range(len(job.outputs(0)))], {}, output_hashes())
        return {**base, **fields}, sent + guards
    finally:
        job.close()


def _changed_draws(job: Job, utilities: Utilities, key: int) -> dict[str, int]:
    """Per drawn input, its elements that no longer hold their draw after the launches."""
    drawn = job.drawn_inputs(0)
    counters = gpu.Allocation(8 * max(len(drawn), 1))
    try:
        gpu.fill(counters.ptr, 0, counters.nbytes, job.context.stream)
        for index, (p, spec, buffer, n) in enumerate(drawn):
            utilities.generate(spec, buffer.ptr, p["nbytes"] // p["itemsize"], fresh_inputs.launch_key(key, 0), n,
                               counters.ptr + 8 * index)
        job.context.synchronize()
        counts = gpu.download(counters.ptr, counters.nbytes).view(np.uint64)
        return {p["name"]: int(counts[index]) for index, (p, _, _, _) in enumerate(drawn)}
    finally:
        counters.free()
