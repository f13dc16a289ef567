"""How likely a kernel that skips work on most of its timed launches is to escape every audit.

A timed launch that skips work gives a wrong output for its own fresh inputs; the score is a median, so
skipping gains anything only on more than half of a case's timed launches. Each job of `n` timed launches
audits `m` of them, drawn uniformly without replacement from the OS's randomness, which no kernel sees
(`secret_audits`); the audits of different jobs are drawn independently.
`escape_bound` is what history.json records per case for an attempt (`audit_escape_bound`) and what
docs/security.md quotes; `worst_escape` is the exact worst case it bounds, for the tests.
"""

from __future__ import annotations

import heapq
import math
import secrets
from typing import NamedTuple

# An attempt's audits must catch a kernel wrong on more than half of a case's timed launches with
# probability at least 1 - 2**-ESCAPE_BITS (harness/settings.py sizes the audits per job for it).
ESCAPE_BITS = 20


def secret_audits(iterations: int, count: int) -> list[int]:
    """The timed launches of a job to audit (or re-check, on rotated sets): `count` of them, drawn uniformly
    without replacement from the OS's randomness so that a kernel cannot predict them."""
    chooser = secrets.SystemRandom()
    return sorted(chooser.sample(range(iterations), min(count, iterations)))


class AuditedJob(NamedTuple):
    """One timing job of a case: its timed launches, and how many of them were audited."""

    launches: int
    audits: int


def escape_bound(jobs: list[AuditedJob] | list[tuple[int, int]]) -> float:
    """An upper bound on the chance that a kernel wrong on more than half of the jobs' launches passes
    every audit: 2 ** -(c N), N the jobs' launches and c the smallest share of a job's launches audited.
    Where every job audits the same share, c N is the jobs' audits: 2 ** -(sum of m_j).

    Why. Say job j has n_j launches, k_j of them wrong, m_j audited, and sum k_j >= N / 2. Its audits all
    miss with the hypergeometric chance C(n_j - k_j, m_j) / C(n_j, m_j) = prod_{i < m_j} (n_j - k_j - i) /
    (n_j - i) <= (1 - k_j / n_j) ** m_j, each factor being at most (n_j - k_j) / n_j. The jobs' audits are
    independent of each other and of which launches the kernel chose to skip (it cannot see them), so

        P(escape) <= prod_j (1 - x_j) ** m_j <= prod_j (1 - x_j) ** (c n_j)      (x_j = k_j / n_j, c <= m_j / n_j)
                   = exp(c N sum_j (n_j / N) log(1 - x_j))
                  <= exp(c N log(1 - sum_j (n_j / N) x_j))                     (log is concave: Jensen)
                   = (1 - K / N) ** (c N) <= 2 ** -(c N)                          (K = sum k_j >= N / 2).

    However the kernel spreads its skips over the jobs, the bound holds; it is tight in the exponent
    when every job is half wrong. A job with no audit (or no jobs at all) bounds nothing: 1."""
    jobs = [AuditedJob(*job) for job in jobs]
    total = sum(job.launches for job in jobs)
    if total == 0 or any(job.audits <= 0 for job in jobs if job.launches):
        return 1.0
    share = min(job.audits / job.launches for job in jobs if job.launches)
    return 2.0 ** -(share * total)


def escape_bits(jobs: list[AuditedJob] | list[tuple[int, int]]) -> float:
    """-log2 of escape_bound: 20 for an attempt's two jobs of 10 audits each."""
    bound = escape_bound(jobs)
    return -math.log2(bound) if bound > 0 else math.inf


def job_escape(launches: int, audits: int, wrong: int) -> float:
    """The exact chance that `audits` launches drawn without replacement from `launches` miss all `wrong` ones."""
    if wrong + audits > launches:
        return 0.0
    return math.comb(launches - wrong, audits) / math.comb(launches, audits)


def worst_escape(jobs: list[AuditedJob] | list[tuple[int, int]]) -> tuple[float, list[int]]:
    """The largest exact chance of escaping every audit over all ways of being wrong on more than half of the
    jobs' launches, and the wrong launches per job that reach it. The log of job_escape is concave in the
    number wrong (a sum of log(n - i - k)), so adding wrong launches one at a time where each costs the least
    log-chance finds the maximum of the separable sum."""
    jobs = [AuditedJob(*job) for job in jobs]
    wanted = sum(job.launches for job in jobs) // 2 + 1
    wrong = [0] * len(jobs)

    def cost(j: int) -> float:  # how much log-chance one more wrong launch in job j loses
        job, k = jobs[j], wrong[j]
        if k >= job.launches:
            return math.inf
        now, then = job_escape(job.launches, job.audits, k), job_escape(job.launches, job.audits, k + 1)
        return math.inf if then == 0.0 else math.log(now) - math.log(then)

    heap = [(cost(j), j) for j in range(len(jobs))]
    heapq.heapify(heap)
    for _ in range(wanted):
        _, j = heapq.heappop(heap)
        wrong[j] += 1
        heapq.heappush(heap, (cost(j), j))
    return math.prod(job_escape(job.launches, job.audits, k) for job, k in zip(jobs, wrong)), wrong
