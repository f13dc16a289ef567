"""The bench's kernels launched directly, outside the referee, for the outside clocks.

    python bench/direct.py ncu PLAN.json       launches each kernel REPEATS times, nothing else:
                                               run under `ncu --clock-control none --cache-control all`
    python bench/direct.py triton PLAN.json OUT.json
                                               triton.testing.do_bench's median for each kernel
    python bench/direct.py flush PLAN.json OUT.json
                                               CUDA-event medians of each kernel after each way of
                                               emptying L2 (a read, a memset, none), and an empty
                                               kernel's: what the flush and the events add
    python bench/direct.py clock PLAN.json OUT.json [serial|concurrent]
                                               kernel-clock medians of each kernel, one step of the
                                               referee's loop added at a time (poison, the rotated
                                               input sets, guard bands, the scan): where a gap to ncu
                                               comes from; with CUPTI's serial kernel tracing (the
                                               referee's) or its concurrent one (instrumented kernels)

PLAN.json is written by bench/timing.py: for each kernel its task folder, source file, case and
seed. Inputs are the task's own (harness.task.make_inputs), and a kernel's launches rotate over the
same input sets as the referee's timed loop (harness.settings.input_seed), so every clock sees the
same work.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.worker_side import execute, gpu  # noqa: E402
from harness.worker_side.buffers import GUARD_BYTES  # noqa: E402
from harness.worker_side.kernel_clock import KernelClock  # noqa: E402
from harness.worker_side.nvrtc import arch_for, compile_kernel  # noqa: E402
from harness.settings import input_seed  # noqa: E402
from harness.jobs import Layout  # noqa: E402
from harness.task_model import Case  # noqa: E402
from harness.task import load_task, make_inputs  # noqa: E402

REPEATS = 7  # launches per input set under ncu
SETS = 4  # the referee's default rotation (Settings.rotation_sets)


class Prepared:
    """One kernel's module, buffers for each input set (inputs uploaded, outputs allocated) and launch."""

    def __init__(self, context: gpu.Context, entry: dict, sets: int = SETS, guard_bytes: int = 0):
        """`guard_bytes`: each array lies between guard bands of that size, placed as the referee
        places them (harness/worker_side/gpu.py GuardedBuffer)."""
        task = load_task(Path(entry["task"]))
        case = Case(name=entry["case"], role="performance", dims=entry["dims"], seed=entry["seed"])
        source = Path(entry["source"]).read_text()
        result = compile_kernel(source, task.kernel_name, arch=arch_for(*context.info.compute_capability))
        if not result.ok:
            raise RuntimeError(f"{entry['label']} does not compile:\n{result.log}")
        self.geometry = task.own_launch(entry["which"]).resolve(case)
        self.module = gpu.Module(result.cubin)
        self.function = self.module.function(result.lowered_name)
        gpu.allow_dynamic_shared(self.function, self.geometry.shared_bytes)
        layout = Layout.for_case(task, case.dims)
        self.buffers: list[gpu.GuardedBuffer] = []
        band = np.zeros(guard_bytes, dtype=np.uint8)
        self.outputs: list[list[tuple[int, int]]] = []  # per set: (pointer, bytes) of each output
        self.arguments = []
        for s in range(sets):
            inputs = make_inputs(task, case.dims, input_seed(case, s))
            values, outputs = [], []
            for kind, spec in layout.params:
                if kind == "scalar":
                    _, dtype, value = spec
                    values.append((dtype, value))
                    continue
                buffer = gpu.GuardedBuffer(spec.nbytes, guard_bytes, band, band)
                self.buffers.append(buffer)
                ptr = buffer.ptr
                if spec.kind == "input":
                    gpu.upload(ptr, np.ascontiguousarray(inputs[spec.name]).view(np.uint8).reshape(-1))
                else:
                    outputs.append((ptr, spec.nbytes))
                values.append(("ptr", ptr))
            self.arguments.append(gpu.kernel_arguments(values))
            self.outputs.append(outputs)

    @property
    def sets(self) -> int:
        return len(self.arguments)

    def launch(self, stream, set_index: int = 0) -> None:
        g = self.geometry
        gpu.launch(self.function, g.grid, g.block, g.shared_bytes, stream, self.arguments[set_index])

    def poison(self, stream, set_index: int) -> None:
        for ptr, nbytes in self.outputs[set_index]:
            gpu.fill(ptr, 0xFF, nbytes, stream)

    def free(self) -> None:
        for buffer in self.buffers:
            buffer.free()
        self.module.unload()


def prepare_all(plan: list[dict], sets: int = SETS) -> tuple[gpu.Context, list[Prepared]]:
    context = gpu.Context(0)
    return context, [Prepared(context, entry, sets) for entry in plan]


def utility_cubin(arch: str) -> bytes:
    """The referee's own kernels (flush, hold, empty, scan), compiled as a worker compiles them."""
    compiled = compile_kernel(execute.UTILITY_SOURCE, "referee_empty", arch=arch)
    if not compiled.ok:
        raise RuntimeError(f"the referee's own kernels did not compile:\n{compiled.log}")
    return compiled.cubin


def utilities(context: gpu.Context, clock=None):
    """The referee's own kernels in this process, with its flush buffer."""
    return execute.Utilities(context, utility_cubin(arch_for(*context.info.compute_capability)), clock)


def under_ncu(plan: list[dict]) -> None:
    """An empty kernel REPEATS times (ncu's own floor), then REPEATS rounds over the input sets,
    kernel by kernel: ncu's values come in that order."""
    context, kernels = prepare_all(plan)
    # Not Utilities: the floors it measures when made would be profiled too.
    module = gpu.Module(utility_cubin(arch_for(*context.info.compute_capability)))
    empty = module.function("referee_empty")
    for _ in range(REPEATS):
        gpu.launch(empty, (1, 1, 1), (1, 1, 1), 0, context.stream, 0)
    context.synchronize()
    for kernel in kernels:
        for _ in range(REPEATS):
            for s in range(kernel.sets):
                kernel.launch(context.stream, s)
        context.synchronize()


def with_triton(plan: list[dict], out: Path) -> None:
    context, kernels = prepare_all(plan)  # first: the device's primary context, which torch then adopts
    import torch  # torch and triton load only for the Triton comparison
    import triton  # as above
    import triton.testing  # as above

    torch.cuda.init()
    medians = {}
    for entry, kernel in zip(plan, kernels, strict=True):
        stream = torch.cuda.current_stream().cuda_stream
        turns = itertools.cycle(range(kernel.sets))
        medians[entry["label"]] = float(triton.testing.do_bench(lambda k=kernel, t=turns: k.launch(stream, next(t)),
                                                                warmup=25, rep=200, return_mode="median"))
    torch.cuda.synchronize()
    out.write_text(json.dumps({"triton": triton.__version__, "median_ms": medians}, indent=1))


FLUSH_LAUNCHES = 200


def by_flush(plan: list[dict], out: Path) -> None:
    context, kernels = prepare_all(plan, sets=1)
    tools = utilities(context)
    stream = context.stream
    ways = {"read": tools.flush_l2,
            "memset": lambda: gpu.fill(tools.flush.ptr, 0x3C, tools.flush_bytes, stream),
            "none": lambda: None}

    def median_ms(launch, before) -> float:
        pairs = [gpu.EventPair() for _ in range(FLUSH_LAUNCHES)]
        try:
            tools.hold(FLUSH_LAUNCHES)
            for pair in pairs:
                before()
                gpu.record(pair.start, stream)
                launch()
                gpu.record(pair.end, stream)
            context.synchronize()
            return float(np.median([pair.elapsed_ms() for pair in pairs]))
        finally:
            for pair in pairs:
                pair.destroy()

    empty = lambda: gpu.launch(tools.empty, (1, 1, 1), (1, 1, 1), 0, stream, 0)  # noqa: E731
    results = {"empty_kernel_ms": median_ms(empty, lambda: None), "median_ms": {}}
    for entry, kernel in zip(plan, kernels, strict=True):
        for _ in range(10):
            kernel.launch(stream)
        results["median_ms"][entry["label"]] = {way: median_ms(lambda k=kernel: k.launch(stream), before)
                                                for way, before in ways.items()}
    out.write_text(json.dumps(results, indent=1))


CLOCK_LAUNCHES = 200
# What runs around each timed launch, one step of the referee's loop (harness/worker_side/execute.py) added at a
# time: (input sets, output poisoned before, arrays between guard bands placed as the referee places
# them, output scanned after).
CLOCK_STEPS = {"one set": (1, False, False, False), "one set, poisoned": (1, True, False, False),
               "rotated sets": (SETS, False, False, False), "rotated sets, poisoned": (SETS, True, False, False),
               "rotated, poisoned, guarded, scanned (the referee's loop)": (SETS, True, True, True)}


def by_clock(plan: list[dict], out: Path, tracing: str = "serial") -> None:
    """Kernel-clock medians of each kernel after the read flush, one step of the referee's loop added
    at a time, with the median of each input set; and an empty kernel's."""

    clock = KernelClock(tracing=tracing)  # before the context, as in the worker
    if not clock.available:
        raise SystemExit(f"no kernel clock: {clock.failure}")
    context = gpu.Context(0)
    tools = utilities(context, clock)
    stream = context.stream
    counter = gpu.Allocation(8)

    def spans_ms(launch, before, after, sets: int) -> list[float]:
        tools.begin()
        tools.hold(CLOCK_LAUNCHES)
        for i in range(CLOCK_LAUNCHES):
            before(i % sets)
            tools.flush_l2()
            tools.tag(i + 1)
            launch(i % sets)
            tools.untag()
            after(i % sets)
        context.synchronize()
        spans, _ = tools.finish(list(range(1, CLOCK_LAUNCHES + 1)))
        if spans is None:
            raise RuntimeError("the kernel clock lost a launch")
        return spans

    def scan(kernel: Prepared, s: int) -> None:
        for ptr, nbytes in kernel.outputs[s]:
            tools.count_equal(ptr, nbytes // 4, 4, 0xFF, counter.ptr)

    nothing = lambda s: None  # noqa: E731
    empty = spans_ms(lambda s: gpu.launch(tools.empty, (1, 1, 1), (1, 1, 1), 0, stream, 0), nothing, nothing, 1)
    results = {"tracing": tracing, "empty_kernel_ms": statistics.median(empty), "launches": CLOCK_LAUNCHES,
               "median_ms": {}, "per_set_ms": {}}
    for entry in plan:
        medians, per_set = {}, {}
        for guarded in (False, True):
            kernel = Prepared(context, entry, SETS, GUARD_BYTES if guarded else 0)
            for s in range(10 * kernel.sets):
                kernel.launch(stream, s % kernel.sets)
            for step, (sets, poisoned, guard, scanned) in CLOCK_STEPS.items():
                if guard != guarded:
                    continue
                poison = (lambda s, k=kernel: k.poison(stream, s)) if poisoned else nothing
                after = (lambda s, k=kernel: scan(k, s)) if scanned else nothing
                spans = spans_ms(lambda s, k=kernel: k.launch(stream, s), poison, after, sets)
                medians[step] = statistics.median(spans)
                per_set[step] = [statistics.median(spans[s::sets]) for s in range(sets)]
            context.synchronize()
            kernel.free()
        results["median_ms"][entry["label"]] = medians
        results["per_set_ms"][entry["label"]] = per_set
    out.write_text(json.dumps(results, indent=1))


def main(argv: list[str]) -> int:
    mode, plan = argv[1], json.loads(Path(argv[2]).read_text())
    if mode == "ncu":
        under_ncu(plan)
    elif mode == "triton":
        with_triton(plan, Path(argv[3]))
    elif mode == "flush":
        by_flush(plan, Path(argv[3]))
    elif mode == "clock":
        by_clock(plan, Path(argv[3]), *argv[4:5])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
