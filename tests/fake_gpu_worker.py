"""A stand-in GPU worker that emulates the matmul_f32 kernel on the CPU, for referee tests.

It speaks the real protocol (harness/worker_side/gpu_worker_main.py's 'ready' message, harness/worker_side/execute.py's answers to
"run" and "time" jobs) and computes c = a @ b in float32 with numpy. What it does wrong is chosen
by `--behaviour=NAME` on its command line (parsed out before the fds):

  honest         a correct kernel
  oob_after      flips one byte of c's tail guard band (just after the end of c)
  oob_before     flips the last byte of c's head guard band (just before the start of c)
  modify_input   reports a different sha256 for input a (fresh inputs: a changed element in launch 0)
  unwritten      leaves the last row of c holding the poison, in both runs
  race           the second run's output differs by 1.0 in one element
  stale_timing   time jobs: re-checked and last outputs of every set return set 0's result (fresh
                 inputs: every audited launch returns the first timed launch's result)
  skip_timing    time jobs: every 4th timed launch leaves 10 elements unwritten
  tampered_timing time jobs: launch 3's audited outputs no longer match their MAC (harness/worker_side/evidence_mac.py)
  batched_timing time jobs: every 4th timed launch takes 0.2 ms, the others 0.01 ms (work done in batches)
  two_mode_timing   time jobs: 55% of the timed launches take 0.05 ms, the others 0.075 ms (padded)
  modes_once_timing the first two time jobs as two_mode_timing (the first may be answered again on the host,
                    when the device does not judge), the later ones honest
  fault          answers a sticky CUDA_ERROR_ILLEGAL_ADDRESS fault, then exits 3
  out_of_memory  answers every job as the real worker does when device memory ran out, and stays up
  no_cublas      vendor_time jobs answer "unavailable" and peaks come without compute peaks

A kernel whose CUBIN holds the bytes "fake: spin_s=N" (a `__device__` string in its source, or the test's
own stand-in CUBIN) takes N seconds per launch, in real time, on performance-sized cases (m * n * k of
at least SPIN_FROM): past the job's launch_limit_s the worker answers "too_slow" and exits, as the real
one does; "fake: stall_s=N" takes as long but ignores the limit (only the parent's deadline stops it).

"vendor_time" jobs compute what cublasGemmEx computes from the job's arguments (column-major, see
`cublas_gemm`), so a wrong mapping gives wrong outputs; "peaks" jobs answer timings of a device
with FAKE_PEAKS.

Only harness/ and sandbox/ are imported: the worker runs with PYTHONSAFEPATH from a scratch folder.
"""

import hashlib
import os
import re
import sys
import time

import numpy as np

from sandbox import wire
from harness.worker_side.fresh_inputs import draw_on_host, launch_key
from harness.worker_side.buffers import audit_slots, canary, pack_outputs, run_slots, time_slots
from harness.task_model import DTYPES
from harness.worker_side.gpu_worker_main import confine_from_argv, regions_from_argv

BEHAVIOURS = {"honest", "oob_after", "oob_before", "modify_input", "unwritten", "race",
              "stale_timing", "skip_timing", "tampered_timing", "fault", "out_of_memory", "no_cublas",
              "quiet_timing", "noisy_timing", "batched_timing", "two_mode_timing", "modes_once_timing"}
SAMPLE_SPREAD_MS = {"quiet_timing": 0.00001, "noisy_timing": 0.005}
TIME_JOBS = [0]  # time jobs answered so far by this worker process
TAMPERED = {"tampered_timing": ["launch 3: its audited outputs"]}
FAKE_PEAKS = {"memory_gbps": 4000.0, "fp32_tflops": 50.0, "tensor_bf16_tflops": 800.0}
EXIT_STICKY = 3
EXIT_TOO_SLOW = 5
SPIN = re.compile(rb"fake: (spin|stall)_s=([0-9.]+)")
SPIN_FROM = 1_000_000  # m * n * k from which a spinning kernel spins: the performance-sized cases

DEVICE = {"ordinal": 0, "name": "Fake CPU matmul device", "compute_capability": [9, 0], "sm_count": 132,
          "l2_bytes": 50 * 1024 * 1024, "max_shared_per_block_optin": 232448, "sm_clock_khz": 1980000,
          "memory_clock_khz": 2619000, "memory_bus_bits": 5120, "total_memory_bytes": 80 * 1024 ** 3,
          "driver_version": 12040}


def _arrays(header):
    return [p for p in header["params"] if p["kind"] != "scalar"]


def _inputs(header, blobs):
    """Input arrays by name, from raw blobs (shape from the scalars m, n, k)."""
    scalars = {p["name"]: p["value"] for p in header["params"] if p["kind"] == "scalar"}
    m, n, k = scalars["m"], scalars["n"], scalars["k"]
    shapes = {"a": (m, k), "b": (k, n)}
    specs = [p for p in _arrays(header) if p["kind"] == "input"]
    if len(specs) != len(blobs):
        raise ValueError(f"expected {len(specs)} input blobs, got {len(blobs)}")
    arrays = {}
    for spec, blob in zip(specs, blobs):
        if len(blob) != spec["nbytes"]:
            raise ValueError(f"input {spec['name']}: {len(blob)} bytes, expected {spec['nbytes']}")
        arrays[spec["name"]] = np.frombuffer(blob, dtype=DTYPES[spec["dtype"]]).reshape(shapes[spec["name"]])
    return arrays, (m, n)


def _matmul(inputs):
    return (inputs["a"].astype(np.float32) @ inputs["b"].astype(np.float32)).astype(np.float32)


def _launch(inputs, shape, poison, behaviour, run_index=0):
    """One emulated launch into an output buffer filled with `poison`; the output's raw bytes."""
    c = np.frombuffer(bytes([poison]) * (shape[0] * shape[1] * 4), dtype=np.float32).reshape(shape).copy()
    result = _matmul(inputs)
    if behaviour == "unwritten":
        c[:-1] = result[:-1]  # the last row keeps the poison
    else:
        c[:] = result
    if behaviour == "race" and run_index == 1:
        c[0, 0] += np.float32(1.0)
    return c.tobytes()


def _evidence(header, input_sets, behaviour):
    """Input hashes per set and every guard band (head, tail per buffer per set)."""
    arrays = _arrays(header)
    seed, guard = header["guard_seed"], header["guard_bytes"]
    hashes, guards = [], []
    for s, inputs in enumerate(input_sets):
        digest = {}
        for i, spec in enumerate(arrays):
            if spec["kind"] == "input" and spec["name"] in inputs:
                raw = np.ascontiguousarray(inputs[spec["name"]]).view(np.uint8).tobytes()
                if behaviour == "modify_input" and spec["name"] == "a":
                    raw = raw[:-1] + bytes([raw[-1] ^ 0x01])
                digest[spec["name"]] = hashlib.sha256(raw).hexdigest()
            head, tail = (g.copy() for g in canary(seed, s * len(arrays) + i, guard))
            if spec["name"] == "c" and behaviour == "oob_after":
                tail[0] ^= 0xFF
            if spec["name"] == "c" and behaviour == "oob_before":
                head[-1] ^= 0xFF
            guards += [head.tobytes(), tail.tobytes()]
        hashes.append(digest)
    return hashes, guards


def _run(header, blobs, behaviour, device=None):
    drawn = header.get("draw_key") is not None  # a large case's inputs, drawn "on the device"
    inputs, shape = _drawn(header, header["draw_key"], 0) if drawn else _inputs(header, blobs[1:])
    outputs = [_launch(inputs, shape, byte, behaviour, run) for run, byte in enumerate(header["poisons"])]
    hashes, guards = _evidence(header, [{} if drawn else inputs], behaviour)
    if drawn:
        changed = {"changed_inputs": {"a": int(behaviour == "modify_input"), "b": 0}}
        hashes = [{}]
    else:
        changed = {}
    if header.get("hold_outputs") or header.get("keep_as"):
        fields = device.hold([outputs]) if header.get("hold_outputs") else device.keep(header, outputs, shape)
        return {"status": "ok", "input_sha256": hashes, **changed, **fields}, guards
    fields, sent = pack_outputs(outputs, run_slots(len(outputs), 1), {})
    return {"status": "ok", "input_sha256": hashes, **changed, **fields}, sent + guards


def _spin(header, cubin):
    """A spinning kernel's launches on a performance-sized case, in real time: the "too_slow" answer where one
    outruns the job's launch limit, else None once they are done."""
    found = SPIN.search(cubin or b"")
    scalars = {p["name"]: p["value"] for p in header["params"] if p["kind"] == "scalar"}
    if found is None or scalars["m"] * scalars["n"] * scalars["k"] < SPIN_FROM:
        return None
    seconds, limit = float(found.group(2)), header.get("launch_limit_s")
    if found.group(1) == b"spin" and limit is not None and seconds > limit:
        time.sleep(limit)
        return {"status": "too_slow", "error": "TOO_SLOW", "detail": f"launch 1 was still running after {limit:.3g} s"}
    launches = len(header["poisons"]) if header["op"] == "run" else header["warmups"] + header["iterations"]
    time.sleep(seconds * launches)
    return None


def _column_major(flat, rows, cols, ld):
    """The rows x cols column-major matrix with leading dimension ld held in a flat array."""
    if ld < rows or flat.size != ld * cols:
        raise ValueError(f"a {rows} x {cols} matrix with ld {ld} does not fit {flat.size} elements")
    return flat.reshape(cols, ld)[:, :rows].T


def cublas_gemm(call, arrays):
    """C = alpha * A · B + beta * C as cublasGemmEx reads its arguments (column-major, no transposes),
    from flat arrays by parameter name; C's new flat float32 contents."""
    if call["transa"] != 0 or call["transb"] != 0:
        raise ValueError("only CUBLAS_OP_N is emulated")
    m, n, k = call["m"], call["n"], call["k"]
    a = _column_major(arrays[call["a_param"]].reshape(-1).astype(np.float32), m, k, call["lda"])
    b = _column_major(arrays[call["b_param"]].reshape(-1).astype(np.float32), k, n, call["ldb"])
    c = np.zeros(call["ldc"] * n, dtype=np.float32)
    _column_major(c, m, n, call["ldc"])[:] = np.float32(call["alpha"]) * (a @ b)
    return c


def _peaks(header, behaviour):
    copies = [{"bytes": b, "ms": [2 * b / (FAKE_PEAKS["memory_gbps"] * 1e9) * 1e3 * f for f in (1.1, 1.0, 1.2)]}
              for b in header["copy_bytes"]]
    flops = 2.0 * header["gemm_size"] ** 3
    gemm = {} if behaviour == "no_cublas" else {
        key: [flops / (FAKE_PEAKS[f"{key}_tflops"] * 1e12) * 1e3 * f for f in (1.05, 1.0)] for key in ("fp32", "tensor_bf16")}
    notes = ["no compute peaks: cuBLAS could not be loaded (fake)"] if behaviour == "no_cublas" else []
    return {"status": "ok", "copies": copies, "gemm_size": header["gemm_size"], "gemm": gemm, "notes": notes}, []


def _samples(header, behaviour):
    iterations = header["iterations"]
    if behaviour == "batched_timing":
        return [0.2 if i % 4 == 0 else 0.01 for i in range(iterations)]
    rng = np.random.default_rng(header["guard_seed"] % (1 << 32))
    TIME_JOBS[0] += 1
    if behaviour == "two_mode_timing" or (behaviour == "modes_once_timing" and TIME_JOBS[0] <= 2):
        padded = rng.permutation(iterations) < round(0.45 * iterations)
        return [float((0.075 if pad else 0.05) + abs(x)) for pad, x in zip(padded, rng.normal(0.0, 0.0005, iterations))]
    return [float(0.05 + abs(x)) for x in rng.normal(0.0, SAMPLE_SPREAD_MS.get(behaviour, 0.001), iterations)]


def _drawn(header, key, launch):
    """A launch's inputs as the device draws them (harness/worker_side/fresh_inputs.py), by name, and (m, n)."""
    scalars = {p["name"]: p["value"] for p in header["params"] if p["kind"] == "scalar"}
    m, n, k = scalars["m"], scalars["n"], scalars["k"]
    shapes = {"a": (m, k), "b": (k, n)}
    specs = [p for p in _arrays(header) if p["kind"] == "input"]
    arrays = {}
    for index, (spec, entry) in enumerate(zip(specs, header["inputs"][0])):
        shape = shapes[spec["name"]]
        words = draw_on_host(entry["drawn"], shape[0] * shape[1], launch_key(key, launch), index)
        arrays[spec["name"]] = words.view(DTYPES[spec["dtype"]]).reshape(shape)
    return arrays, (m, n)


def _draw_run(header, device=None):
    """The reference's outputs for the draws of the given launches (always honest)."""
    draws = header["draws"]
    outputs = []
    for launch in draws["launches"]:
        inputs, shape = _drawn(header, draws["key"], launch)
        outputs.append(_launch(inputs, shape, header["poisons"][0], "honest"))
    hashes, guards = _evidence(header, [{}], "honest")
    if header.get("keep_as"):
        kept = [device.keep_launch(f"{header['keep_as']}/{launch}", blob, shape)
                for launch, blob in zip(draws["launches"], outputs)]
        return {"status": "ok", "input_sha256": hashes, "kept": kept, "output_sha256": [], "outputs_sent": 0}, guards
    fields, sent = pack_outputs(outputs, [f"{launch}/0" for launch in draws["launches"]], {})
    return {"status": "ok", "input_sha256": hashes, **fields}, sent + guards


def _fresh_time(header, behaviour, compute=None, device=None):
    """A time job on fresh inputs: only the audited launches are computed."""
    iterations, warmups, key = header["iterations"], header["warmups"], header["fresh"]["key"]
    checked = sorted(set(header["checked_launches"]))
    launches = [checked[0]] * len(checked) if behaviour == "stale_timing" else checked
    outputs = []
    for i in launches:
        inputs, shape = _drawn(header, key, warmups + i)
        outputs.append(compute(inputs) if compute else _launch(inputs, shape, header["poison"], behaviour))
    unwritten = [10 if behaviour == "skip_timing" and i % 4 == 0 else 0 for i in range(iterations)]
    changed = [1 if behaviour == "modify_input" and i == 0 else 0 for i in range(iterations)]
    samples = _samples(header, behaviour)
    hashes, guards = _evidence(header, [{}] * header["sets"], "honest")
    answer = {"status": "ok", "samples_ms": samples, "unwritten": unwritten, "changed_inputs": changed,
              "input_sha256": hashes, "event_overhead_ms": 0.002, "host_kept_up": True,
              "tampered": TAMPERED.get(behaviour, [])}
    held = device.hold([[blob] for blob in outputs]) if header.get("hold_outputs") else {}
    if held.get("held_outputs") is not None:
        return {**answer, **held, "output_sha256": [], "outputs_sent": 0}, guards
    fields, sent = pack_outputs(outputs, audit_slots(checked, 1), {})
    return {**answer, **held, **fields}, sent + guards


def _time(header, blobs, behaviour, compute=None, device=None):
    if header.get("fresh"):
        return _fresh_time(header, behaviour, compute, device)
    sets, iterations = header["sets"], header["iterations"]
    poison = header["poison"]
    checked = sorted(set(header["checked_launches"]))
    per_set = (len(blobs) - 1) // sets
    input_sets, shape = [], None
    for s in range(sets):
        inputs, shape = _inputs(header, blobs[1 + s * per_set: 1 + (s + 1) * per_set])
        input_sets.append(inputs)
    results = [compute(inputs) if compute else _launch(inputs, shape, poison, behaviour) for inputs in input_sets]
    if behaviour == "stale_timing":
        results = [results[0]] * sets
    poisoned = [int((np.frombuffer(r, np.uint8).reshape(-1, 4) == poison).all(axis=1).sum()) for r in results]
    unwritten = [poisoned[i % sets] + (10 if behaviour == "skip_timing" and i % 4 == 0 else 0)
                 for i in range(iterations)]
    samples = _samples(header, behaviour)
    checked_blobs = [results[i % sets] for i in checked]
    hashes, guards = _evidence(header, input_sets, behaviour)
    fields, sent = pack_outputs(checked_blobs + results, time_slots(checked, sets, 1), header.get("known_outputs") or {})
    answer = {"status": "ok", "samples_ms": samples, "unwritten": unwritten, "input_sha256": hashes,
              "event_overhead_ms": 0.002, "host_kept_up": True, "tampered": TAMPERED.get(behaviour, []), **fields}
    return answer, sent + guards


class DeviceJudging:
    """Outputs judged "on the device" (harness/worker_side/device_judging.py's protocol), emulated: a held output
    is a file in the --ipc-dir folder shared by both stand-ins, its "IPC handle" the file's path; the judging
    itself is the host path's (harness/output_digest.py), reported as the judging kernels' totals. Without
    --ipc-dir the candidate cannot export its outputs, as on a system without CUDA IPC. --forget-kept: the
    reference's worker drops its kept outputs after every judging job (as after a restart)."""

    def __init__(self, folder, forget):
        self.folder, self.forget = folder, forget
        self.kept, self.count = {}, 0

    def hold(self, groups):
        """groups: a check's [first run, second run] of its one output (c), or a timing's [c] per audited launch."""
        if self.folder is None:
            return {"held_outputs": None, "held_error": "CUDA_ERROR_NOT_SUPPORTED: operation not supported (fake)"}
        held = []
        for group in groups:
            held.append([])
            for blob in group:
                self.count += 1
                path = os.path.join(self.folder, f"{os.getpid()}-{self.count}.bin")
                with open(path, "wb") as f:
                    f.write(blob)
                held[-1].append({"handle": path.encode().hex(), "offset": 0})
        return {"held_outputs": held}

    def keep_launch(self, key, blob, shape):
        from harness.compare import raw_words
        c = np.frombuffer(blob, dtype=np.float32).reshape(shape)
        self.kept[key] = c
        return {"key": key, "outputs": [{"name": "c", "spread": _spread(c),
                                         "poison_count": int(np.count_nonzero(raw_words(c) == 0xFFFFFFFF))}]}

    def keep(self, header, outputs, shape):
        from harness.compare import agreement, raw_words
        from harness.worker_side.buffers import tree_sha256
        first, second = (np.frombuffer(b, dtype=np.float32).reshape(shape) for b in outputs)
        rtol, atol = header["tolerances"]["c"]
        self.kept[header["keep_as"]] = first
        spread = _spread(first)
        poisoned = int(np.count_nonzero(raw_words(first) == 0xFFFFFFFF))
        return {"kept": [{"name": "c", "tree_sha256": tree_sha256(first), "spread": spread, "poison_count": poisoned,
                          "differ": int(np.count_nonzero(raw_words(first) != raw_words(second))),
                          "mismatches": int(agreement(first, second, rtol, atol).value == "differs")}],
                "kept_expected": sorted(self.kept)}

    def judge(self, header):
        """A check's outputs, or with "launches" each audited launch of a timing, in one job."""
        if "launches" not in header:
            return self.judge_one(header)
        judged = []
        for launch in header["launches"]:
            answer = self.judge_one({**header, **launch})
            if answer["status"] != "ok":
                return answer
            judged.append(answer["judged"])
        return {"status": "ok", "judged_launches": judged}

    def judge_one(self, header):
        from harness.compare import compare_output, raw_words
        from harness.output_digest import digest_on_host
        if header["expected"] not in self.kept:
            return {"status": "expected_missing", "error": "EXPECTED_MISSING", "detail": header["expected"]}
        expected = self.kept[header["expected"]]
        if self.forget:
            self.kept.clear()
        if header.get("drop_expected"):
            self.kept.pop(header["expected"], None)
        (out,) = header["outputs"]
        runs = []
        for entry in out["runs"]:
            with open(bytes.fromhex(entry["handle"]).decode(), "rb") as f:
                runs.append(np.frombuffer(f.read(), dtype=np.float32).reshape(expected.shape))
        first, second = runs
        digest = digest_on_host("c", expected, first, second, out["rtol"], out["atol"])
        check, flat = digest.check, first.reshape(-1)
        written = ~(raw_words(first) == 0xFFFFFFFF) | ~(raw_words(second) == 0x7F7F7F7F)
        pair = compare_output("c", first.reshape(-1)[written], second.reshape(-1)[written], out["rtol"], out["atol"])
        firsts = [int(np.ravel_multi_index(m.index, expected.shape)) for m in check.first_mismatches]
        totals = {"mismatches": check.mismatches, "nonfinite_mismatches": check.nonfinite_mismatches,
                  "max_abs_bits": _bits(check.max_abs_error), "max_rel_bits": _bits(check.max_rel_error),
                  "first_mismatch": firsts[0] if firsts else (1 << 64) - 1, "unwritten": digest.unwritten,
                  "first_unwritten": (int(np.ravel_multi_index(digest.first_unwritten, expected.shape))
                                      if digest.unwritten else (1 << 64) - 1),
                  "pair_differ_bits": int(np.count_nonzero(raw_words(first)[written] != raw_words(second)[written])),
                  "pair_mismatches": pair.mismatches}
        mismatches = [[i, expected.reshape(-1)[i:i + 1].tobytes().hex(), flat[i:i + 1].tobytes().hex()]
                      for i in firsts[:header["first_mismatches"]]]
        return {"status": "ok", "judged": [{"name": "c", "totals": totals, "mismatches": mismatches}]}


def _spread(values):
    finite = values[np.isfinite(values)].astype(np.float64)
    return {"nonfinite": int(values.size - finite.size),
            "finite_min_key": _order_key(finite.min()) if finite.size else (1 << 64) - 1,
            "finite_max_key": _order_key(finite.max()) if finite.size else 0}


def _bits(value):
    return int(np.array(value, dtype=np.float64).view(np.uint64))


def _order_key(value):
    bits = _bits(value)
    return (~bits & ((1 << 64) - 1)) if bits >> 63 else bits | (1 << 63)


def main(argv):
    flags = [a for a in argv[1:] if a.startswith("--")]
    fds = [a for a in argv[1:] if not a.startswith("--")]
    behaviours = [f.split("=", 1)[1] for f in flags if f.startswith("--behaviour=")]
    behaviour = behaviours[-1] if behaviours else "honest"
    folders = [f.split("=", 1)[1] for f in flags if f.startswith("--ipc-dir=")]
    device = DeviceJudging(folders[-1] if folders else None, "--forget-kept" in flags)
    jobs = os.fdopen(int(fds[0]), "rb")
    answers = os.fdopen(int(fds[1]), "wb")
    if behaviour not in BEHAVIOURS:
        wire.send(answers, {"status": "startup_error", "error": "BadBehaviour", "detail": behaviour})
        return 4
    confined = confine_from_argv(argv)
    regions = regions_from_argv(argv)
    wire.send(answers, {"status": "ready", "device": dict(DEVICE, ordinal=int(fds[2])), "arch": "sm_90",
                        "event_overhead_ms": 0.002, "pid": os.getpid(), "shared_regions": regions[0] is not None, **confined})
    while True:
        try:
            header, blobs = wire.receive(jobs, 1 << 34, regions[0])
        except wire.PeerClosed:
            return 0
        op = header.get("op")
        if op == "exit":
            return 0
        if behaviour == "fault":
            wire.send(answers, {"status": "fault", "error": "CUDA_ERROR_ILLEGAL_ADDRESS",
                                "detail": "an illegal memory access was encountered"})
            return EXIT_STICKY
        if behaviour == "out_of_memory":
            wire.send(answers, {"status": "out_of_memory", "error": "CUDA_ERROR_OUT_OF_MEMORY",
                                "detail": "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2) (3 MiB free of 81920 MiB)"})
            continue
        slow = _spin(header, bytes(blobs[0])) if op in ("run", "time") else None
        if slow is not None:
            wire.send(answers, slow, [], regions[1])
            return EXIT_TOO_SLOW
        if op == "run":
            answer, out = _run(header, blobs, behaviour, device)
        elif op == "judge":
            answer, out = device.judge(header), []
        elif op == "time":
            answer, out = _time(header, blobs, behaviour, device=device)
        elif op == "draw_run":
            answer, out = _draw_run(header, device)
        elif op == "vendor_time" and behaviour == "no_cublas":
            answer, out = {"status": "unavailable", "error": "CUBLAS_UNAVAILABLE",
                           "detail": "cuBLAS could not be loaded: DynamicLibNotFoundError (fake)"}, []
        elif op == "vendor_time":  # no CUBIN blob: the inputs come first
            answer, out = _time(header, [b""] + blobs, behaviour,
                                lambda inputs: cublas_gemm(header["vendor"], inputs).tobytes())
        elif op == "peaks":
            answer, out = _peaks(header, behaviour)
        else:
            answer, out = {"status": "error", "error": "UNKNOWN_OP", "detail": f"unknown op {op!r}"}, []
        wire.send(answers, answer, out, regions[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
