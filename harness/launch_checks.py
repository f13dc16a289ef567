"""What a launch's per_case may name: a task's launches its own cases, a candidate's launch the visible cases (a
holdout name is refused like any other, so a refusal tells nothing about the hidden cases). A key that names no
case would otherwise be kept and never used, and the kernel launched with a geometry its author did not mean."""

from __future__ import annotations

from collections.abc import Sequence

from harness.task_model import Case, LaunchError, LaunchSpec


def unknown_per_case(spec: LaunchSpec, names: Sequence[str]) -> tuple[str, str] | None:
    """(key, why) for the first per_case key of ``spec`` that names none of ``names``; None when each names one."""
    key = next((key for key in spec.per_case if key not in names), None)
    return None if key is None else (key, f"there is no case named {key!r} (cases: {', '.join(names)})")


def check_candidate_launch(spec: LaunchSpec, visible: Sequence[Case]) -> None:
    """A candidate's launch: each per_case key names a visible case, and the geometry resolves on every one.
    Raises :class:`LaunchError` (a ValueError) naming the entry."""
    if (unknown := unknown_per_case(spec, [case.name for case in visible])) is not None:
        raise LaunchError(f"per_case.{unknown[0]}", unknown[1])
    for case in visible:
        spec.resolve(case)
