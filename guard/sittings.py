"""The accepted ratio's rounds taken in sittings: each a fresh guard step (a new executor and worker, the kernel's
checks run first), as every later guard run is one.

A kernel's pace can shift from one executor to the next more than from one job to the next in the same worker:
softmax_f32's initial kernel on square-4096 read 50.1 us over an approval's 32 rounds in one executor and 47.7
to 47.9 us in each of 19 guard steps after it on the same H100 (bench/recorded/h100-2026-12-07-c), so every
unchanged guard run of it read "improved" by 5%, and a 3% slowdown would have passed. Rounds spread over several
sittings weigh each executor's pace in the accepted ratio, and each sitting is set up as a guard step is (its
checks run before its first round), so the approval times the kernel in the state a guard times it in.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import ExitStack

from guard.measure import LABELS, GuardStep, StepCost
from guard.verdict import TimingRound

SITTINGS = 4  # the accepted ratio's default 32 rounds as four guard steps of 8, the guard's own minimum

log = logging.getLogger(__name__)


class SittingFailed(Exception):
    """A sitting's kernels did not compile, the kernel failed its checks there, or it ran on another GPU than the
    first sitting: no ratio is measured."""


class Sittings:
    """A round callable (guard/accepted.py `measure`) that opens a fresh guard step every `rounds_each` rounds.
    `open_step(gpu_uuid)` makes a sitting's step: the first's GPU UUID is given for every later one (None for the
    first), and a sitting on another GPU is refused."""

    def __init__(self, open_step: Callable[[str | None], GuardStep], rounds_each: int):
        if rounds_each < 1:
            raise ValueError(f"a sitting takes at least one round, not {rounds_each}")
        self.open_step, self.rounds_each = open_step, rounds_each
        self.step: GuardStep | None = None
        self.environment: dict = {}  # the first sitting's executor's
        self.sittings, self.taken = 0, 0
        self.cost = StepCost()  # every sitting's, summed

    @classmethod
    def for_rounds(cls, open_step: Callable[[str | None], GuardStep], rounds: int,
                   sittings: int = SITTINGS) -> Sittings:
        """Sittings of an even number of rounds (a guard step puts either kernel first in turn, so each does so
        equally often in every sitting), as many as take `rounds`."""
        each = max(2, math.ceil(rounds / sittings))
        return cls(open_step, each + each % 2)

    def __enter__(self) -> Sittings:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self._close()
            return
        try:  # an error already on its way out is the one told
            self._close()
        except Exception:  # noqa: BLE001
            log.warning("a sitting's guard step did not close cleanly", exc_info=True)

    def __call__(self, only: list[str] | None) -> dict[str, TimingRound]:
        if self.step is None or self.taken >= self.rounds_each:
            self._next()
        self.taken += 1
        return self.step.round(only)

    def _next(self) -> None:
        self._close()
        step = self.open_step(self.environment.get("gpu_uuid"))
        with ExitStack() as stack:
            stack.callback(self._add_cost, step)  # after the step closes, where admitting it fails
            stack.enter_context(step)
            self.sittings += 1
            self._admit(step)
            stack.pop_all()
        self.step, self.taken = step, 0

    def _admit(self, step: GuardStep) -> None:
        first, here = self.environment.get("gpu_uuid"), step.environment.get("gpu_uuid")
        if self.environment and first != here:
            raise SittingFailed(f"sitting {self.sittings} ran on GPU {here}, the first on {first}: one ratio's rounds "
                                "are taken on one GPU")
        if not self.environment:
            self.environment = dict(step.environment)
        if set(step.kernels) != set(LABELS):
            raise SittingFailed("the kernels do not compile here: "
                                + "; ".join(r for c in step.compile_failures for r in c.reasons)[:500])
        failed = [c for c in step.checks() if not c.passed]
        if failed:
            raise SittingFailed(f"the kernel fails its checks in sitting {self.sittings}: " + "; ".join(
                f"{c.name}: {'; '.join(c.reasons)}" for c in failed)[:500])

    def _close(self) -> None:
        step, self.step = self.step, None
        if step is None:
            return
        try:
            step.__exit__(None, None, None)
        finally:
            self._add_cost(step)

    def _add_cost(self, step: GuardStep) -> None:
        done, mine = self.cost, step.cost
        self.cost = StepCost(start_s=done.start_s + mine.start_s, checks_s=done.checks_s + mine.checks_s,
                             timing_s=done.timing_s + mine.timing_s, total_s=done.total_s + mine.total_s,
                             rounds=done.rounds + mine.rounds)
