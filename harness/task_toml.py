"""task.toml written from a :class:`~harness.new_task_spec.TaskPlan`: the manifest `kernel-referee new-task`
makes, in the order and style of the shipped tasks (docs/task-format.md), comments included."""

from __future__ import annotations

import json
import re

from harness.new_task_spec import TaskPlan
from harness.task_model import Case, Cost, Generator, LaunchSpec
from harness.tolerance_proposal import ToleranceProposal

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INTEGER = re.compile(r"-?[0-9]+")


def key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def value(item) -> str:
    """A TOML value: strings as basic strings (JSON's escapes are TOML's), numbers, lists, inline tables."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, (int, float)):
        return repr(item)
    if isinstance(item, str):
        return json.dumps(item, ensure_ascii=False).replace("\x7f", "\\u007f")  # TOML refuses a raw DEL
    if isinstance(item, (list, tuple)):
        return "[" + ", ".join(value(x) for x in item) + "]"
    if isinstance(item, dict):
        return "{ " + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()) + " }"
    raise TypeError(f"no TOML value for {type(item).__name__}")


def expression(text: str):
    """An expression as the shipped tasks write it: a bare integer when it is one."""
    return int(text) if _INTEGER.fullmatch(text) else text


def _table(header: str, entries: dict) -> list[str]:
    return [f"[{header}]"] + [f"{key(k)} = {value(v)}" for k, v in entries.items() if v is not None] + [""]


def _launch(header: str, spec: LaunchSpec) -> list[str]:
    lines = _table(header, {"grid": [expression(g) for g in spec.grid], "block": [expression(b) for b in spec.block],
                            "shared_bytes": expression(spec.shared_bytes)})
    for case, override in spec.per_case.items():
        lines += _launch(f"{header}.per_case.{key(case)}", override)
    return lines


def _generator(gen: Generator) -> dict:
    return {k: getattr(gen, k) for k in ("kind", "low", "high", "mean", "std")}


def _case(case: Case, prefix: str = "") -> list[str]:
    rows = ["[[cases]]", f"name = {value(case.name)}", f"role = {value(case.role)}",
            f"dims = {value(case.dims)}", f"seed = {case.seed}"]
    return [prefix + row for row in rows] + [""]


def _header(plan: TaskPlan, oracle: bool) -> list[str]:
    lines = ["# Made by `kernel-referee new-task`; `kernel-referee lint` checks it.",
             f"name = {value(plan.name)}", f"description = {value(plan.description)}"]
    if oracle:
        lines.append('oracle = "oracle.py"')
    lines += ["# The units a kernel may compute on (docs/task-format.md, \"Arithmetic\"): \"cuda-cores\" (no tensor "
              "cores), \"any\", or the tensor-core input types allowed, e.g. [\"bf16\"].",
              f"arithmetic = {value(plan.spec.arithmetic)}"]
    kernel = {"name": plan.kernel_name, "signature": plan.signature}
    return lines + [""] + _table("kernel", kernel)


def _params(plan: TaskPlan) -> list[str]:
    lines = []
    for p in plan.params:
        entries = {"name": p.name, "kind": p.kind, "dtype": p.dtype}
        if p.kind == "scalar":
            entries["value"] = expression(p.value)
        else:
            entries["shape"] = [expression(s) for s in p.shape]
        lines += ["[[params]]"] + [f"{k} = {value(v)}" for k, v in entries.items()] + [""]
    for name, gen in plan.inputs.items():
        lines += _table(f"inputs.{key(name)}", _generator(gen))
    return lines


def _cost(cost: Cost | None) -> list[str]:
    if cost is None:
        return []
    fields = {"flops": cost.flops, "bytes": cost.bytes, "compute": cost.compute if cost.compute != "fp32" else None}
    return _table("cost", {k: expression(v) if k != "compute" and v is not None else v for k, v in fields.items()})


def _vendor(plan: TaskPlan) -> list[str]:
    if plan.vendor is None:
        return []
    return (["# The yardstick: cuBLAS computing the same product, timed and checked like a kernel and reported as",
             '# "vs cuBLAS" (never part of a verdict). Proposed from the shapes: delete it if the kernel computes',
             "# something else."] + _table("vendor", plan.vendor.model_dump()))


def render(plan: TaskPlan, tolerances: dict[str, ToleranceProposal], oracle: bool,
           holdout: str = "none") -> str:
    """task.toml's text. `holdout`: "none", "comment" (the proposed holdout commented out) or "active"."""
    lines = _header(plan, oracle) + _params(plan)
    for p in plan.outputs:
        proposal = tolerances[p.name]
        lines += proposal.comment + _table(f"tolerance.{key(p.name)}", {"rtol": proposal.rtol, "atol": proposal.atol})
    lines += _launch("launch", plan.spec.launch)
    for header, spec in (("reference_launch", plan.spec.reference_launch), ("initial_launch", plan.spec.initial_launch)):
        if spec is not None:
            lines += _launch(header, spec)
    lines += _cost(plan.spec.cost) + _vendor(plan)
    for case in plan.cases:
        lines += _case(case)
    if plan.proposed_holdout is not None and holdout == "active":
        lines += _case(plan.proposed_holdout)
    elif plan.proposed_holdout is not None and holdout == "comment":
        lines += ["# Proposed holdout case, kept from the agent and checked at the end (uncomment to keep it; a",
                  "# run without one cannot get a replay's GO):"] + _case(plan.proposed_holdout, "# ")
    return "\n".join(lines).rstrip() + "\n"
