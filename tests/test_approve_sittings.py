"""approve measures the accepted ratio in sittings, each a fresh guard step with its checks first, as the guard's
runs are taken: a kernel whose pace shifts from one executor to the next is weighed as the guard meets it."""

from __future__ import annotations

import io

import pytest

from guard.measure import LABELS, StepCost
from guard.sittings import SittingFailed, Sittings
from guard.step import guard_approval
from guard.store import approval_dir, load_approval, load_store
from guard.verdict import Verdict, VerdictSettings
from server.decision import CheckResult
from harness.stats import summarize
from server.replay import replay
from tests.approval_support import NAME, approved, fake, fresh_run, run_dir  # noqa: F401 - fixtures
from tests.fake_executor import FakeExecutor

QUICK = VerdictSettings(min_rounds=8, step_rounds=4, max_rounds=12)


class Paced(FakeExecutor):
    """The approved kernel (the source with a latency marker) `pace` times as slow in this executor; with `wrong`,
    wrong on every case here."""

    def __init__(self, task, pace: float = 1.0, wrong: bool = False):
        super().__init__(task, gpu="Fake GPU")
        self.pace, self.wrong = pace, wrong

    def _source(self, kernel):
        source = super()._source(kernel)
        return source + "\n// fake: wrong\n" if self.wrong and "latency_us" in source else source

    def time(self, kernel, cases):
        report = super().time(kernel, cases)
        if "latency_us" not in self._source(kernel):
            return report
        cases = [c.model_copy(update={"samples_ms": [x * self.pace for x in c.samples_ms],
                                      "stats": summarize([x * self.pace for x in c.samples_ms])}) for c in report.cases]
        return report.model_copy(update={"cases": cases})


def executors(**first_options):
    """A factory whose first executor is made with `first_options`, the others plain; the list of those made."""
    made = []

    def make(task, timing):
        made.append(Paced(task, **(first_options if not made else {})))
        return made[-1]
    return make, made


def test_the_rounds_are_taken_in_four_fresh_guard_steps_each_checked_before_it_is_timed(fresh_run, tmp_path):
    assert replay(fresh_run, io.StringIO(), repeats=1, make_executor=fake) == 0  # approve uses the recorded one
    make, made = executors()
    code, store, _, out = approved(tmp_path, fresh_run, make_executor=make)
    assert code == 0, out
    assert len(made) == 4 and all(e.calls.count("time") == 16 for e in made)  # 8 rounds of two jobs each
    assert all("check" in e.calls and e.calls.index("check") < e.calls.index("time") for e in made)
    assert all(e.closed.is_set() for e in made)  # each sitting's executor closed
    measured = load_store(store)[0].approval.ratio_measurement
    assert measured.rounds == 32 and "32 rounds of the guard's timing in 4 guard steps" in measured.why


def test_a_kernel_slower_in_one_executor_is_accepted_at_its_usual_pace(fresh_run, tmp_path):
    """One sitting 5% slower (an H100 read softmax_f32's kernel so in the executor an approval measured in): the
    accepted ratio is the other sittings', and an unchanged guard run passes instead of reading "improved"."""
    assert replay(fresh_run, io.StringIO(), repeats=1, make_executor=fake) == 0
    make, _ = executors(pace=1.05)
    code, store, _, out = approved(tmp_path, fresh_run, make_executor=make)
    assert code == 0, out
    for case in load_store(store)[0].approval.cases:
        assert case.ratio.estimate == pytest.approx(0.5, rel=0.01), case
    result = guard_approval(load_approval(store, NAME), fake, QUICK)
    assert [v.verdict for v in result.verdicts] == [Verdict.PASS] * 2, [v.message for v in result.verdicts]


def test_a_kernel_that_fails_its_checks_in_a_sitting_is_not_approved(fresh_run, tmp_path, capsys):
    assert replay(fresh_run, io.StringIO(), repeats=1, make_executor=fake) == 0
    make, made = executors(wrong=True)
    code, store, _, _ = approved(tmp_path, fresh_run, make_executor=make)
    assert code == 1 and not approval_dir(store, NAME).exists()
    err = capsys.readouterr().err
    assert "measuring the accepted ratio: the kernel fails its checks in sitting 1" in err and "mismatch" in err
    assert len(made) == 1 and "time" not in made[0].calls  # refused before any round


class Step:
    """A stand-in guard step on GPU `gpu`, its kernels compiled (unless `compiled` is false) and checked (failing
    where `fails`); each made one is kept in `opened`, each closed one in `closed`."""

    def __init__(self, opened: list, closed: list, gpu: str = "GPU-0", compiled: bool = True, fails: bool = False):
        self.opened, self.closed, self.fails = opened, closed, fails
        self.kernels, self.compile_failures = (dict.fromkeys(LABELS) if compiled else {}), []
        self.environment, self.cost = {"gpu": "G", "gpu_uuid": gpu}, StepCost(timing_s=1.0)

    def __enter__(self):
        self.opened.append(self)
        return self

    def __exit__(self, *exc):
        self.closed.append(self)

    def checks(self):
        return [CheckResult(name="replay odd", kind="replay", passed=not self.fails, reasons=["mismatch: 3"])]

    def round(self, only):
        self.cost = self.cost.model_copy(update={"rounds": self.cost.rounds + 1})
        return {}


def test_sittings_close_each_step_sum_their_costs_and_take_even_rounds():
    opened, closed, asked = [], [], []

    def open_step(first_gpu):
        asked.append(first_gpu)
        return Step(opened, closed)

    with Sittings.for_rounds(open_step, rounds=10, sittings=4) as sittings:  # 3 a sitting, made even: 4
        for _ in range(10):
            sittings(None)
        assert len(opened) == 3 and len(closed) == 2
    assert closed == opened and sittings.sittings == 3 and sittings.environment["gpu_uuid"] == "GPU-0"
    assert asked == [None, "GPU-0", "GPU-0"]  # every later sitting asked for the first one's GPU
    assert (sittings.cost.rounds, sittings.cost.timing_s) == (10, 3.0)
    assert Sittings.for_rounds(open_step, rounds=32).rounds_each == 8
    with pytest.raises(ValueError):
        Sittings(open_step, 0)


@pytest.mark.parametrize("second, why", [
    ({"gpu": "GPU-1"}, "sitting 2 ran on GPU GPU-1, the first on GPU-0"),
    ({"compiled": False}, "the kernels do not compile here"),
    ({"fails": True}, "the kernel fails its checks in sitting 2: replay odd: mismatch: 3")])
def test_a_sitting_refused_is_closed_and_counted(second, why):
    opened, closed = [], []
    made = iter([Step(opened, closed), Step(opened, closed, **second)])
    with pytest.raises(SittingFailed) as failed:
        with Sittings(lambda first_gpu: next(made), 2) as sittings:
            for _ in range(4):
                sittings(None)
    assert why in str(failed.value)
    assert closed == opened and len(opened) == 2 and sittings.cost.timing_s == 2.0


def test_an_executor_that_fails_to_start_in_a_later_sitting_refuses_the_approval(fresh_run, tmp_path, capsys):
    assert replay(fresh_run, io.StringIO(), repeats=1, make_executor=fake) == 0
    made = []

    def make(task, timing):
        if made:
            raise RuntimeError("no device left")
        made.append(Paced(task))
        return made[-1]

    code, store, _, _ = approved(tmp_path, fresh_run, make_executor=make)
    assert code == 1 and not approval_dir(store, NAME).exists()
    assert "its executor failed: RuntimeError: no device left" in capsys.readouterr().err
    assert made[0].closed.is_set()
