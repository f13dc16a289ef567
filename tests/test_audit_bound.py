"""The bound on escaping every audit (harness/audit_bound.py): against the exact hypergeometric worst case, against a
simulation of a kernel that skips work, and the settings an attempt times with."""

import math
import random

import pytest

from harness.audit_bound import (ESCAPE_BITS, AuditedJob, escape_bits, escape_bound, job_escape, secret_audits,
                                 worst_escape)
from harness.settings import TimingSettings
from server.run import RunSettings


def test_an_attempt_with_the_default_settings_audits_every_case_below_two_to_the_minus_twenty():
    """The fewest jobs record_attempt times a case in: one per round, each of `iterations` launches."""
    run = RunSettings()
    timing = run.timing
    jobs = [AuditedJob(timing.iterations, timing.checked_launches)] * run.timing_rounds
    assert sum(job.audits for job in jobs) >= ESCAPE_BITS
    assert escape_bound(jobs) <= 2.0 ** -ESCAPE_BITS
    assert worst_escape(jobs)[0] < 2.0 ** -ESCAPE_BITS
    # more batches (noise-adaptive sampling) audit the same share: only more bits
    assert escape_bits(jobs * 2) == pytest.approx(2 * escape_bits(jobs))


def test_the_bound_is_two_to_the_minus_the_audits_where_every_job_audits_the_same_share():
    assert escape_bound([(100, 10), (100, 10)]) == pytest.approx(2.0 ** -20)
    assert escape_bound([(40, 10), (40, 10), (80, 20)]) == pytest.approx(2.0 ** -40)
    assert escape_bits([(100, 3), (100, 3), (100, 3), (100, 3)]) == pytest.approx(12)  # matmul_f32 before: 1/4096


def test_the_smallest_share_sets_the_bound_where_shares_differ():
    """A kernel puts its skips where audits are thinnest: the bound follows the smallest share, not the total."""
    jobs = [(100, 30), (100, 2)]
    assert escape_bound(jobs) == pytest.approx(2.0 ** -(0.02 * 200))
    assert worst_escape(jobs)[0] <= escape_bound(jobs)
    assert worst_escape(jobs)[0] > 2.0 ** -32  # the total alone would claim far too much


def test_nothing_audited_bounds_nothing():
    assert escape_bound([]) == 1.0
    assert escape_bound([(100, 10), (100, 0)]) == 1.0


def test_job_escape_is_the_hypergeometric_chance():
    assert job_escape(10, 3, 0) == 1.0
    assert job_escape(10, 3, 8) == 0.0
    assert job_escape(10, 3, 5) == pytest.approx((5 / 10) * (4 / 9) * (3 / 8))
    assert job_escape(100, 10, 51) <= (1 - 51 / 100) ** 10


@pytest.mark.parametrize("seed", range(40))
def test_the_exact_worst_case_never_exceeds_the_bound(seed):
    rng = random.Random(seed)
    share = rng.choice([0.03, 0.1, 0.25])
    sizes = [rng.choice([20, 40, 100]) for _ in range(rng.randint(1, 4))]
    jobs = [AuditedJob(n, max(1, round(share * n))) for n in sizes]
    worst, wrong = worst_escape(jobs)
    assert sum(wrong) == sum(job.launches for job in jobs) // 2 + 1
    assert all(0 <= k <= job.launches for k, job in zip(wrong, jobs))
    assert worst <= escape_bound(jobs) * (1 + 1e-12)


def test_the_worst_case_is_the_largest_over_every_way_to_spread_the_skips():
    """Brute force over every split of the wrong launches between two small jobs."""
    jobs = [AuditedJob(12, 3), AuditedJob(20, 2)]
    wanted = 32 // 2 + 1
    brute = max(job_escape(12, 3, k) * job_escape(20, 2, wanted - k) for k in range(0, 13) if wanted - k <= 20)
    assert worst_escape(jobs)[0] == pytest.approx(brute)


def test_a_simulated_kernel_that_skips_most_launches_escapes_as_often_as_computed():
    """A kernel wrong on 60 of 100 launches in each of two jobs, audited by secret_audits: how often no audit lands
    on a wrong launch, against the exact chance and the bound."""
    jobs, trials = [AuditedJob(100, 3), AuditedJob(100, 3)], 20_000
    rng = random.Random(7)
    wrong_sets = [set(rng.sample(range(100), 60)) for _ in jobs]
    escaped = sum(all(not wrong & set(secret_audits(job.launches, job.audits)) for job, wrong in zip(jobs, wrong_sets))
                  for _ in range(trials))
    exact = math.prod(job_escape(job.launches, job.audits, 60) for job in jobs)
    sigma = math.sqrt(exact * (1 - exact) / trials)
    assert abs(escaped / trials - exact) < 5 * sigma
    assert exact <= escape_bound(jobs)


def test_secret_audits_are_distinct_sorted_and_within_the_job():
    audits = secret_audits(100, 10)
    assert audits == sorted(set(audits)) and len(audits) == 10 and all(0 <= i < 100 for i in audits)
    assert secret_audits(5, 10) == [0, 1, 2, 3, 4]


def test_the_audits_per_job_are_a_fixed_share_of_its_launches():
    assert TimingSettings().checked_launches == 10
    assert TimingSettings(iterations=400).checked_launches == 40
    assert TimingSettings(iterations=40).checked_launches == 10


def test_a_case_whose_snapshots_would_not_fit_audits_fewer_launches_and_its_bound_says_so():
    settings = TimingSettings()
    assert settings.audits_per_job(16 << 20) == 10  # matmul_f32's 2048 x 2048 floats
    assert settings.audits_per_job(1 << 30) == 3  # two snapshots fit the 2 GiB, at least 3 are taken
    assert settings.audits_per_job(300 << 20) == 6
    weaker = [AuditedJob(settings.iterations, settings.audits_per_job(1 << 30))] * RunSettings().timing_rounds
    assert escape_bound(weaker) == pytest.approx(2.0 ** -6)
