"""What a GPU worker does with a time job: warm-ups, then timed launches, as named steps.

Runs inside the worker process only; it judges nothing (harness/referee.py does, in the parent).

Every launch, warm-ups included, is readied outside its timed window: with fresh inputs (header
"fresh"), its device-drawn inputs are drawn for that launch (harness/worker_side/fresh_inputs.py); the module's
writable globals are put back to their initial image and its outputs poisoned (execute.Job.poison);
with a cold L2, the L2 is flushed. After it, still outside the window, its outputs are scanned for
poison left unwritten, its drawn inputs are checked against their draw, and the outputs of the
audited launches (a secret subset the parent chose) are copied to snapshots. The counts and the snapshots
go to the evidence context (harness/worker_side/evidence.py) in stream order, before the next launch runs,
sealed there by a keyed MAC (harness/worker_side/evidence_mac.py): a launch that repairs another's evidence
is named in the answer ("tampered").

The whole timed loop is queued behind a hold kernel, with no host synchronization inside it, so
that each launch's event pair (and kernel-clock record) measures the GPU, not the host's pace.
"""

from __future__ import annotations

from time import perf_counter

import numpy as np

from harness.worker_side import device_judging, evidence, evidence_mac, gpu
from harness.worker_side.cuda_check import CudaError
from harness.worker_side.job import Job, Launcher
from harness.worker_side.messages import TimeAnswer, TimeJob
from harness.worker_side.utility_kernels import MAX_HOLD_NS, Utilities
from harness.worker_side.buffers import audit_slots, digests_later, pack_outputs, time_slots
from sandbox.answers import Status

# Per timed launch (uint64 each): output elements still poisoned, drawn input elements changed, the MAC of those two,
# the MAC of its outputs where it is audited (else 0).
_RECORD_BYTES = evidence_mac.RECORD_BYTES


def time_job(context: gpu.Context, utilities: Utilities, header: TimeJob, blobs: list[bytes],
             launcher: Launcher | None = None) -> tuple[TimeAnswer, list[bytes]]:
    """Run a time job. With a `launcher` (a vendor library call, harness/worker_side/cublas.py) the blobs hold only
    the inputs and each launch is that call, under exactly the same protocol."""
    loop = TimedLoop(context, utilities, header, blobs, launcher)
    try:
        loop.upload_sets()
        loop.warm_up()
        loop.queue_timed_launches()
        loop.wait_for_timed_launches()
        loop.phase("gpu")
        return loop.answer()
    finally:
        loop.close()


class TimedLoop:
    def __init__(self, context: gpu.Context, utilities: Utilities, header: dict, blobs: list[bytes],
                 launcher: Launcher | None):
        self.context, self.utilities, self.header = context, utilities, header
        self.sets, self.iterations, self.warmups = header["sets"], header["iterations"], header["warmups"]
        self.clocked = header.get("clock", "kernel") == "kernel" and utilities.clock is not None
        self.checked = sorted(set(header["checked_launches"]))
        self.fresh_key = (header.get("fresh") or {}).get("key")  # None: the rotated fixed sets
        self.limit_s = header.get("launch_limit_s")  # a launch still running after this is too slow
        cubin, self.input_blobs = (None, blobs) if launcher is not None else (blobs[0], blobs[1:])
        self.phases: dict[str, float] = {}
        self._mark = perf_counter()
        self.counters = self.snapshots = self.scratch = self.queued = None
        self.evidence = evidence.of_worker(utilities)
        self.seal = evidence_mac.Seal(utilities, self.evidence)
        self.pairs: list[gpu.EventPair] = []
        self.job = Job(context, header, cubin, sets=self.sets, launcher=launcher, resident=utilities.resident)
        self.n_out = len(self.job.outputs(0))
        self.output_bytes = sum(p["nbytes"] for p in self.job.arrays if p["kind"] == "output")
        try:
            self._allocate()
        except BaseException:
            self.close()  # nothing made for a job that could not start is left behind
            raise
        self.phase("setup")

    def _allocate(self) -> None:
        # The scratch (the candidate's context): one launch's record, its counts (output elements still poisoned,
        # drawn input elements changed) and their seals. The counters (the evidence context): every timed launch's.
        making_room = self.utilities.resident.making_room
        self.scratch = making_room(gpu.Allocation, _RECORD_BYTES)
        self.counters = making_room(self.evidence.allocate, _RECORD_BYTES * max(self.iterations, 1))
        self.snapshots = making_room(self.evidence.allocate, self.output_bytes * len(self.checked))
        for _ in range(self.iterations):  # one at a time: those made before a failure are destroyed too
            self.pairs.append(gpu.EventPair())
        self.queued = gpu.EventPair()
        self.utilities.begin()

    def phase(self, name: str) -> None:
        """The worker's own seconds per phase, for the bench."""
        now = perf_counter()
        self.phases[name] = round(now - self._mark, 6)
        self._mark = now

    # -- the steps -----------------------------------------------------------------------------
    def upload_sets(self) -> None:
        taken = 0
        for s in range(self.sets):
            sent = self.job.sent_inputs(s)
            self.job.upload_inputs(s, self.input_blobs[taken:taken + sent])
            taken += sent
        if taken != len(self.input_blobs):
            raise ValueError(f"{len(self.input_blobs)} input blobs for {taken} inputs sent")
        self.phase("upload")

    def ready(self, launch: int, set_index: int) -> None:
        """Everything a launch needs before its window: fresh inputs, initial globals, poisoned outputs."""
        if self.fresh_key is not None:
            self.job.draw(self.utilities, set_index, self.fresh_key, launch)
        self.job.poison(set_index, self.header["poison"])

    def warm_up(self) -> None:
        """The first warm-up is waited for alone, within the launch limit: a kernel that spins is stopped
        before more launches queue up behind it."""
        for i in range(self.warmups):
            self.ready(i, i % self.sets)
            self.job.launch(i % self.sets)
            if i == 0 and self.limit_s is not None:
                self.context.wait(self.limit_s, "warm-up launch 1")
        self.context.wait(self._limit_of(self.warmups - 1), f"the {self.warmups} warm-up launches")
        gpu.reset_persisting_l2()

    def queue_timed_launches(self) -> None:
        utilities, stream, job = self.utilities, self.context.stream, self.job
        utilities.hold(self.iterations)
        started = perf_counter()
        gpu.record(self.queued.start, stream)
        snapshot_ptr = self.snapshots.ptr
        checked = set(self.checked)
        for i in range(self.iterations):
            s = i % self.sets
            self.ready(self.warmups + i, s)
            if self.header["cold_l2"]:
                utilities.flush_l2()
            gpu.record(self.pairs[i].start, stream)
            if self.clocked:
                utilities.tag(i + 1)
            job.launch(s)
            if self.clocked:
                utilities.untag()
            gpu.record(self.pairs[i].end, stream)
            self.count(i, s)
            if i in checked:
                for _, p, buffer in job.outputs(s):
                    self.evidence.take(snapshot_ptr, buffer.ptr, p["nbytes"], stream)
                    snapshot_ptr += p["nbytes"]
            self.seal_record(i, s, i in checked)
        # Still inside the hold when everything is queued: the GPU never waited for the host.
        self.host_kept_up = not gpu.completed(self.queued.start)
        utilities.queued(self.iterations, perf_counter() - started, self.host_kept_up)

    def count(self, launch: int, set_index: int) -> None:
        """Queue timed launch `launch`'s counts into the scratch, zeroed first (the launch itself may have written
        it)."""
        stream, scratch = self.context.stream, self.scratch.ptr
        gpu.fill(scratch, 0, _RECORD_BYTES, stream)
        for _, p, buffer in self.job.outputs(set_index):
            self.utilities.count_equal(buffer.ptr, p["nbytes"] // p["itemsize"], p["itemsize"], self.header["poison"],
                                       scratch)
        if self.fresh_key is not None:
            self.job.draw(self.utilities, set_index, self.fresh_key, self.warmups + launch, changed=scratch + 8)

    def seal_record(self, launch: int, set_index: int, audited: bool) -> None:
        """Queue the MACs of launch `launch`'s counts and, audited, of its outputs (the very bytes just snapshotted)
        into the scratch, then the record's move to the evidence context: all before the next launch."""
        outputs = [(buffer.ptr, p["nbytes"]) for _, p, buffer in self.job.outputs(set_index)] if audited else None
        self.seal.queue(launch, self.scratch.ptr, outputs)
        self.evidence.take(self.counters.ptr + _RECORD_BYTES * launch, self.scratch.ptr, _RECORD_BYTES,
                           self.context.stream)

    def wait_for_timed_launches(self) -> None:
        """Everything queued done. With a launch limit, each timed launch must end within it of the one before
        (the first, of the hold): a launch that spins is stopped there, not after the whole loop."""
        if self.limit_s is not None:
            for i, pair in enumerate(self.pairs):
                allowed = self.limit_s + (MAX_HOLD_NS / 1e9 if i == 0 else 0.0)
                self.context.wait_until(lambda pair=pair: gpu.completed(pair.end), allowed, f"timed launch {i + 1}")
        self.context.wait(self.limit_s, "the work after the timed launches")

    def _limit_of(self, launches: int) -> float | None:
        """The limit of `launches` launches waited for together."""
        return None if self.limit_s is None else self.limit_s * max(launches, 1)

    def snapshot_offsets(self) -> list[list[int]]:
        """Device address of each re-checked launch's copy of each output: back to back, in launch order."""
        sizes = [p["nbytes"] for _, p, _ in self.job.outputs(0)]
        offsets, at = [], self.snapshots.ptr
        for _ in self.checked:
            offsets.append([])
            for size in sizes:
                offsets[-1].append(at)
                at += size
        return offsets

    def snapshot_parts(self) -> dict[int, list[tuple[int, int]]]:
        """Per audited launch, its snapshots' (evidence address, bytes), one per output."""
        sizes = [p["nbytes"] for _, p, _ in self.job.outputs(0)]
        return {i: list(zip(at, sizes)) for i, at in zip(self.checked, self.snapshot_offsets())}

    # -- the answer ----------------------------------------------------------------------------
    def answer(self) -> tuple[TimeAnswer, list[bytes]]:
        utilities, iterations = self.utilities, self.iterations
        samples_ms = [pair.elapsed_ms() for pair in self.pairs]
        tags = list(range(1, iterations + 1)) if self.clocked else []
        kernel_ms, gpu_busy_ms, records = utilities.finish_with_records(tags)
        if not self.clocked:
            kernel_ms = records = None
        counts = self.evidence.download(self.counters.ptr, self.counters.nbytes).view(np.uint64).reshape(-1, 4)
        unwritten, changed = counts[:iterations, 0], counts[:iterations, 1]
        tampered = self.seal.verify(counts[:iterations], self.snapshot_parts())  # before any snapshot is handed on
        held = self.hold_snapshots() if self.header.get("hold_outputs") and self.fresh_key is not None else {}
        if held.get("held_outputs") is not None:  # judged on the device: only the inputs' evidence is read back
            inputs_host, blobs, slots = self.utilities.staging.take(self.job.input_bytes()), [], []
        else:
            inputs_host, blobs, slots = self.read_back()
        output_hashes = digests_later(blobs)  # hashed on the hashing threads while the inputs are checked
        self.phase("read_back")
        hashes, guards = self.job.evidence(inputs_host)
        self.job.keep_inputs(hashes)
        self.phase("evidence")
        fields, sent = pack_outputs(blobs, slots, self.header.get("known_outputs") or {}, output_hashes())
        self.phase("hash_outputs")
        answer: TimeAnswer = {"status": Status.OK, "samples_ms": samples_ms, "kernel_samples_ms": kernel_ms,
                  "clock_note": None if self.clocked else utilities.clock_note or "events asked for",
                  "gpu_busy_ms": gpu_busy_ms, "unwritten": [int(u) for u in unwritten],
                  "changed_inputs": [int(c) for c in changed] if self.fresh_key is not None else None,
                  "launch_records": records if self.job.function_name() is not None else None,
                  "input_sha256": hashes, "event_overhead_ms": utilities.event_overhead_ms,
                  "kernel_floor_ms": utilities.kernel_floor_ms, "host_kept_up": self.host_kept_up,
                  "phases_s": self.phases, "resident_inputs": utilities.resident.keys(), "tampered": tampered,
                  **held, **fields}
        return answer, sent + guards

    def hold_snapshots(self) -> dict:
        """Fresh inputs judged on the device (harness/worker_side/device_judging.py): the audited launches'
        snapshots stay here until the next job, and their handles go back, per audited launch per output.
        Where they cannot be exported, they are read back as usual ("held_error")."""
        try:
            with self.evidence.current():  # the snapshots are the evidence context's allocation
                entries = [[device_judging.export(self.snapshots.ptr, ptr) for ptr in launch]
                           for launch in self.snapshot_offsets()]
        except CudaError as exc:
            return {"held_outputs": None, "held_error": f"{exc.name}: {exc}"}
        self.utilities.held.keep(self.snapshots)
        self.snapshots = None  # freed at the next job, once judged
        return {"held_outputs": entries}

    def read_back(self) -> tuple[np.ndarray, list, list[str]]:
        """(host room for the inputs' evidence, the output blobs to send, their slots). Fresh inputs: every
        audited launch's snapshot. Rotated sets: the re-checked snapshots (each one equal to its set's last
        output given as that same object, hashed once), then the last output of every set."""
        job, n_out = self.job, self.n_out
        sets = 0 if self.fresh_key is not None else self.sets
        inputs_host, host = np.split(
            self.utilities.staging.take(job.input_bytes() + self.snapshots.nbytes + self.output_bytes * sets),
            [job.input_bytes()])
        lasts, offset = [], self.snapshots.nbytes
        for s in range(sets):
            for _, p, buffer in job.outputs(s):
                lasts.append(host[offset:offset + p["nbytes"]])
                gpu.download_into(buffer.ptr, lasts[-1])
                offset += p["nbytes"]
        at, blobs = self.snapshot_offsets(), []
        for k, i in enumerate(self.checked):
            for j, (_, p, _) in enumerate(job.outputs(i % self.sets)):
                start = at[k][j] - self.snapshots.ptr
                blobs.append(host[start:start + p["nbytes"]])
                self.evidence.download_into(at[k][j], blobs[-1])
                if sets and np.array_equal(blobs[-1], lasts[(i % sets) * n_out + j]):
                    blobs[-1] = lasts[(i % sets) * n_out + j]  # the same bytes: the same object, hashed once
        if self.fresh_key is not None:
            return inputs_host, blobs, audit_slots(self.checked, n_out)
        return inputs_host, blobs + lasts, time_slots(self.checked, self.sets, n_out)

    def close(self) -> None:
        if self.context is not None and self.context.stuck:
            return  # a kernel still runs: releasing would wait for it, and the worker ends anyway
        for pair in self.pairs + ([self.queued] if self.queued else []):
            pair.destroy()
        for allocation in (self.scratch, self.counters, self.snapshots):
            if allocation is not None:
                allocation.free()
        self.job.close()
