"""The bench's kernels launched directly, outside the referee, for the outside clocks.

    python bench/direct.py ncu PLAN.json       launches each kernel REPEATS times, nothing else:
                                               run under `ncu --clock-control none --cache-control all`
    python bench/direct.py triton PLAN.json OUT.json
                                               triton.testing.do_bench's median for each kernel
    python bench/direct.py flush PLAN.json OUT.json
                                               CUDA-event medians of each kernel after each way of
                                               emptying L2 (a read, a memset, none), and an empty
                                               kernel's: what the flush and the events add

PLAN.json is written by bench/timing.py: for each kernel its task folder, source file, case and
seed. Inputs are the task's own (harness.task.make_inputs), so every clock sees the same work.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import gpu  # noqa: E402
from harness.compile import arch_for, compile_kernel  # noqa: E402
from harness.jobs import Layout  # noqa: E402
from harness.task import Case, load_task, make_inputs  # noqa: E402

REPEATS = 7


class Prepared:
    """One kernel's module, buffers (inputs uploaded, outputs allocated) and launch."""

    def __init__(self, context: gpu.Context, entry: dict):
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
        inputs = make_inputs(task, case.dims, case.seed)
        self.buffers, values = [], []
        for kind, spec in layout.params:
            if kind == "scalar":
                _, dtype, value = spec
                values.append((dtype, value))
                continue
            buffer = gpu.Allocation(spec.nbytes)
            self.buffers.append(buffer)
            if spec.kind == "input":
                gpu.upload(buffer.ptr, np.ascontiguousarray(inputs[spec.name]).view(np.uint8).reshape(-1))
            values.append(("ptr", buffer.ptr))
        self.arguments = gpu.kernel_arguments(values)

    def launch(self, stream) -> None:
        g = self.geometry
        gpu.launch(self.function, g.grid, g.block, g.shared_bytes, stream, self.arguments)


def prepare_all(plan: list[dict]) -> tuple[gpu.Context, list[Prepared]]:
    context = gpu.Context(0)
    return context, [Prepared(context, entry) for entry in plan]


def under_ncu(plan: list[dict]) -> None:
    context, kernels = prepare_all(plan)
    for kernel in kernels:
        for _ in range(REPEATS):
            kernel.launch(context.stream)
        context.synchronize()


def with_triton(plan: list[dict], out: Path) -> None:
    context, kernels = prepare_all(plan)  # first: the device's primary context, which torch then adopts
    import torch
    import triton
    import triton.testing

    torch.cuda.init()
    medians = {}
    for entry, kernel in zip(plan, kernels, strict=True):
        stream = torch.cuda.current_stream().cuda_stream
        medians[entry["label"]] = float(triton.testing.do_bench(lambda k=kernel: k.launch(stream),
                                                                warmup=25, rep=200, return_mode="median"))
    torch.cuda.synchronize()
    out.write_text(json.dumps({"triton": triton.__version__, "median_ms": medians}, indent=1))


FLUSH_LAUNCHES = 200


def by_flush(plan: list[dict], out: Path) -> None:
    from harness import execute

    context, kernels = prepare_all(plan)
    compiled = compile_kernel(execute.UTILITY_SOURCE, "referee_empty", arch=arch_for(*context.info.compute_capability))
    utilities = execute.Utilities(context, compiled.cubin)
    stream = context.stream
    ways = {"read": utilities.flush_l2,
            "memset": lambda: gpu.fill(utilities.flush.ptr, 0x3C, utilities.flush_bytes, stream),
            "none": lambda: None}

    def median_ms(launch, before) -> float:
        pairs = [gpu.EventPair() for _ in range(FLUSH_LAUNCHES)]
        try:
            utilities.hold(FLUSH_LAUNCHES)
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

    empty = lambda: gpu.launch(utilities.empty, (1, 1, 1), (1, 1, 1), 0, stream, 0)  # noqa: E731
    results = {"empty_kernel_ms": median_ms(empty, lambda: None), "median_ms": {}}
    for entry, kernel in zip(plan, kernels, strict=True):
        for _ in range(10):
            kernel.launch(stream)
        results["median_ms"][entry["label"]] = {way: median_ms(lambda k=kernel: k.launch(stream), before)
                                                for way, before in ways.items()}
    out.write_text(json.dumps(results, indent=1))


def main(argv: list[str]) -> int:
    mode, plan = argv[1], json.loads(Path(argv[2]).read_text())
    if mode == "ncu":
        under_ncu(plan)
    elif mode == "triton":
        with_triton(plan, Path(argv[3]))
    elif mode == "flush":
        by_flush(plan, Path(argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
