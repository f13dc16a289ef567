"""Checks judged on the device: a case whose outputs are large is judged by the reference's worker, against
expected outputs it computed and kept on its own device, through the IPC handles of the candidate's outputs
(harness/worker_side/device_judging.py). Only totals and a few elements cross to the host, so a case's
reach is the GPU's memory, not the host's pipe.

The verdict is the host path's: the same rule (harness/worker_side/judge_source.py, held to
harness/compare.py by tests), the same digest (harness/output_digest.py) and the same reasons. Where the
device path cannot run (no IPC on this system, a judging job that fails), the check falls back to the host
path and says why once (`device_off`). Expected outputs the parent already holds (a run's locked ones)
bind the kept ones: where their sha256-tree differs, that case is judged on the host, against the locked
bytes.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np

from harness import jobs
from harness.footprint import outputs_on_device
from harness.judging import mismatch_detail, unwritten_by_reference
from harness.output_digest import FIRST_MISMATCHES, OutputDigest, digest_from_totals
from harness.settings import CompiledKernel, ReferenceFailed, input_seed
from harness.task_model import DTYPES, Case
from harness.worker_calls import ExpectedMissing, RunResult, call_worker, guard_bytes_of, launch_geometry
from harness.worker_side import buffers
from harness.worker_side.judge_source import STATS_FIELDS, TOTALS_FIELDS

JUDGE_ANSWER_BYTES = 1 << 20


@dataclass(frozen=True)
class KeptExpected:
    """Expected outputs the reference's worker keeps, by key: each output's sha256-tree and spread."""

    key: str
    tree_sha256: dict[str, str]
    spread: dict[str, dict[str, int]]
    poison_count: dict[str, int]  # elements holding the timing poison's pattern (a right output may)


class DeviceChecks:
    """The Referee's device path (a mixin: it uses the Referee's pool, task, settings, inputs and runs)."""

    def _device_init(self) -> None:
        self.device_off: str | None = None  # why checks are judged on the host after all, once known
        self._kept: dict[tuple[str, int], KeptExpected] = {}
        self._host_trees: dict[tuple[str, int], dict[str, str]] = {}
        self._host_only: set[tuple[str, int]] = set()  # kept outputs that are not the locked ones: judged on the host
        self.judged_on_device = 0  # cases judged there so far
        self.audits_on_device = 0  # audited timed launches judged there so far
        # The sha256-trees a run locked for expected outputs it keeps only as hashes, by (case, seed): every
        # computation of those outputs, on the device or the host, must give them again.
        self._locked_trees: dict[tuple[str, int], dict[str, str]] = {}

    def expected_trees(self, case: Case, seed: int) -> dict[str, str] | None:
        """The sha256-trees of a case's expected outputs, computed and kept on the device where the case is
        judged there; None where it is judged on the host (its outputs then come from expected())."""
        if not self.judges_on_device(case):
            return None
        kept = self._kept_expected(case, seed, self.inputs(case, seed))
        return None if kept is None else dict(kept.tree_sha256)

    def lock_trees(self, case: Case, seed: int, trees: dict[str, str]) -> None:
        """A run's locked sha256-trees of expected outputs it does not hold (a resumed run, a replay)."""
        self._locked_trees[(case.name, seed)] = dict(trees)

    def check_locked(self, case: Case, seed: int, trees: dict[str, str]) -> None:
        """Raise ReferenceFailed where the run locked other outputs for this case and seed."""
        locked = self._locked_trees.get((case.name, seed))
        if locked is not None and locked != trees:
            raise ReferenceFailed(case.name, "its outputs are not the ones the run locked (their sha256-tree "
                                             "differs): the reference does not reproduce them bit for bit here, or "
                                             "the GPU or its driver changed")

    def judges_on_device(self, case: Case) -> bool:
        return self.device_off is None and outputs_on_device(self.task, case, self.settings)

    def check_on_device(self, kernel: CompiledKernel, case: Case, seed: int) -> RunResult | None:
        """The candidate's run on the case, judged on the device; None where that cannot be done (the
        check then goes the host's way)."""
        made = self.inputs(case, seed)
        kept = self._kept_expected(case, seed, made)
        if kept is None:
            return None
        result = self._run(self.pool.candidate, kernel, case, *made, on_device={"hold_outputs": True}, seed=seed)
        if result.failure is not None:
            return result
        held = result.answer.get("held_outputs")
        if not isinstance(held, list) or len(held) != len(result.layout.outputs):
            self._off(f"the candidate's outputs could not be shared with the judging worker "
                      f"({result.answer.get('held_error') or 'no handles'})")
            return None
        once = seed not in self._fixed_seeds(case)  # a secret seed's expected outputs go once judged
        try:
            digests = self._judge(case, kept, result.layout, held, drop=once)
        except ExpectedMissing:
            self._kept.pop((case.name, seed), None)
            kept = self._kept_expected(case, seed, made)
            digests = self._judge(case, kept, result.layout, held, drop=once) if kept is not None else None
        if digests is None:
            return None
        result.digests = digests
        self.judged_on_device += 1
        return result

    def _off(self, why: str) -> None:
        if self.device_off is None:
            self.device_off = why

    # -- the expected outputs, kept in the reference's worker ----------------------------------------
    def _kept_expected(self, case: Case, seed: int, made) -> KeptExpected | None:
        key = (case.name, seed)
        if key in self._kept or key in self._host_only:
            return self._kept.get(key)
        tolerances = {p.name: list(self._tolerance(p.name)) for p in self.task.output_params}
        result = self._run(self.pool.reference, self.reference, case, *made,
                           on_device={"keep_as": f"{case.name}/{seed}", "tolerances": tolerances}, seed=seed)
        if result.failure is not None:
            raise ReferenceFailed(case.name, f"{result.failure.code.value}: {result.failure.detail}")
        problems = result.integrity.guard_violations + [f"modified input {n}" for n in result.integrity.modified_inputs]
        if problems:
            raise ReferenceFailed(case.name, "; ".join(problems))
        try:
            kept = _read_kept(result.answer, result.layout, f"{case.name}/{seed}", case.name)
        except jobs.AnswerError as exc:
            self._off(f"the reference's outputs kept on the device do not read: {exc}")
            return None
        self.check_locked(case, seed, kept.tree_sha256)
        held = self._expected.get(key)
        if held is not None and self._host_tree(key, held) != kept.tree_sha256:
            self._host_only.add(key)  # not the bytes the run locked: this case is judged on the host, against those
            return None
        if seed in self._fixed_seeds(case):
            self._kept[key] = kept
        return kept

    def _fixed_seeds(self, case: Case) -> set[int]:
        return {input_seed(case, i) for i in range(self.settings.rotation_sets)}

    def host_trees(self, case: Case, seed: int, outputs: dict[str, np.ndarray]) -> dict[str, str]:
        return self._host_tree((case.name, seed), outputs)

    def _host_tree(self, key: tuple[str, int], outputs: dict[str, np.ndarray]) -> dict[str, str]:
        if key not in self._host_trees:
            self._host_trees[key] = {name: buffers.tree_sha256(array) for name, array in outputs.items()}
        return self._host_trees[key]

    def kept_facts(self, case: Case, seed: int) -> KeptExpected | None:
        """The facts of a case's expected outputs kept on the device (its poison count...), where it is judged
        there; None where it is judged on the host."""
        if not self.judges_on_device(case):
            return None
        return self._kept_expected(case, seed, self.inputs(case, seed))

    # -- a fresh-input timing's audits --------------------------------------------------------------
    def device_draws(self, timed, fresh: jobs.FreshDraws, launches: list[int]) -> list[KeptExpected]:
        """The reference's outputs for the inputs the given launches of a fresh time job draw, kept on the device
        (one key per launch), with each output's spread and poison count."""
        case, layout = timed.case, timed.layout
        geometry, failure = launch_geometry(self.reference, case)
        if failure is not None:
            raise ReferenceFailed(case.name, f"{failure.code.value}: {failure.detail}")
        guard_seed = secrets.randbits(62)
        prefix = f"{case.name}/draws/{fresh.key:016x}"

        def build(resident: frozenset[str]):
            header, blobs = jobs.make_draw_run_job(self.reference.cubin, self.reference.symbol, layout, geometry,
                                                   timed.input_sets[0], fresh, launches, guard_seed,
                                                   timed.sent_hashes[0], resident)
            return {**header, "keep_as": prefix}, blobs

        # One reference launch per audited launch in this one job: each gets a check job's allowance.
        deadline_s = self.run_deadline_s(case) * max(1, len(launches))
        answer, _, failure = call_worker(self.pool.reference, build, deadline_s,
                                         guard_bytes_of(layout, 1), case.name, self._deadline())
        if failure is not None:
            raise ReferenceFailed(case.name, f"{failure.code.value} on the inputs of audited launches: {failure.detail}")
        kept = answer.get("kept")
        if not isinstance(kept, list) or len(kept) != len(launches):
            raise jobs.AnswerError("the reference's kept audit outputs do not match the launches")
        return [KeptExpected(key=entry.get("key"), tree_sha256={}, **_facts(entry.get("outputs") or []))
                for entry in kept]

    def judge_audits(self, timed, answer: dict, audited: list[int], expected: list[KeptExpected]) -> list[str] | None:
        """"launch I: detail" for each audited launch whose held outputs are wrong, all judged in one job of the
        reference's worker; None where they could not be judged on the device (device_off says why; the batch is
        then timed again on the host)."""
        held = answer.get("held_outputs")
        if not isinstance(held, list) or len(held) != len(audited):
            self._off(f"the candidate's timed outputs could not be shared with the judging worker "
                      f"({answer.get('held_error') or 'no handles'})")
            return None
        case, layout = timed.case, timed.layout
        # one launch: its outputs stand for both runs
        launches = [self._judge_header(kept, layout, [[entry, entry] for entry in entries], drop=True)
                    for kept, entries in zip(expected, held)]
        header = {"op": "judge", "launches": launches, "poisons": list(buffers.POISON_BYTES),
                  "first_mismatches": FIRST_MISMATCHES}
        try:
            answer, _, failure = call_worker(self.pool.reference, lambda resident: (header, []),
                                             self.run_deadline_s(case), JUDGE_ANSWER_BYTES, case.name,
                                             self._deadline())
        except ExpectedMissing:
            self._off("the reference's worker no longer held the audited launches' expected outputs")
            return None
        if failure is not None:
            self._off(f"judging on the device failed: {failure.code.value}: {failure.detail}")
            return None
        judged, wrong = answer.get("judged_launches"), []
        if not isinstance(judged, list) or len(judged) != len(audited):
            self._off("judging on the device gave an answer that does not name every audited launch")
            return None
        atols = {s.name: self._tolerance(s.name)[1] for s in layout.outputs}
        for i, kept, entry in zip(audited, expected, judged):
            try:
                digests = _read_judged({"judged": entry}, layout, kept, atols)
            except jobs.AnswerError as exc:
                self._off(f"judging on the device gave an answer that does not read: {exc}")
                return None
            wrong += [f"launch {i}: {mismatch_detail(d.check)}" for d in digests if not d.check.passed]
        self.audits_on_device += len(audited)
        return wrong

    def judges_audits_on_device(self, case: Case) -> bool:
        """Whether a fresh-input timing of the case leaves its audited outputs on the device, judged there."""
        return self.device_off is None and (self.settings.device_audits or outputs_on_device(self.task, case,
                                                                                            self.settings))

    # -- the judging job -----------------------------------------------------------------------------
    def _judge_header(self, kept: KeptExpected, layout: jobs.Layout, held: list, drop: bool) -> dict:
        outputs = []
        for spec, runs in zip(layout.outputs, held):
            rtol, atol = self._tolerance(spec.name)
            itemsize = DTYPES[spec.dtype].itemsize
            outputs.append({"name": spec.name, "dtype": spec.dtype, "itemsize": itemsize,
                            "elements": spec.nbytes // itemsize, "rtol": rtol, "atol": atol, "runs": runs})
        return {"expected": kept.key, "outputs": outputs, "drop_expected": drop}

    def _judge(self, case: Case, kept: KeptExpected, layout: jobs.Layout,
               held: list, drop: bool = False) -> list[OutputDigest] | None:
        header = {"op": "judge", **self._judge_header(kept, layout, held, drop), "poisons": list(buffers.POISON_BYTES),
                  "first_mismatches": FIRST_MISMATCHES}
        answer, _, failure = call_worker(self.pool.reference, lambda resident: (header, []),
                                         self.run_deadline_s(case), JUDGE_ANSWER_BYTES, case.name, self._deadline())
        if failure is not None:
            self._off(f"judging on the device failed: {failure.code.value}: {failure.detail}")
            return None
        try:
            return _read_judged(answer, layout, kept, {s.name: self._tolerance(s.name)[1] for s in layout.outputs})
        except jobs.AnswerError as exc:
            self._off(f"judging on the device gave an answer that does not read: {exc}")
            return None


def _read_kept(answer: dict, layout: jobs.Layout, key: str, case: str) -> KeptExpected:
    facts = answer.get("kept")
    names = [spec.name for spec in layout.outputs]
    if not isinstance(facts, list) or [f.get("name") for f in facts if isinstance(f, dict)] != names:
        raise jobs.AnswerError("the reference's kept outputs do not match the case's outputs")
    shapes = {spec.name: spec.shape for spec in layout.outputs}
    for fact in facts:
        if fact.get("unwritten"):  # each run's poison still there: not a race, elements the reference never wrote
            shape = shapes[fact["name"]]
            first_at = np.unravel_index(int(fact.get("first_unwritten") or 0), shape) if shape else ()
            raise ReferenceFailed(case, unwritten_by_reference(fact["name"], int(fact["unwritten"]),
                                                               math.prod(shape), [int(i) for i in first_at]))
        if fact.get("differ") and fact.get("mismatches"):
            raise ReferenceFailed(case, f"it is not deterministic: two runs on the same inputs differ beyond the "
                                        f"tolerance in {fact['name']}")
        if not isinstance(fact.get("tree_sha256"), str):
            raise jobs.AnswerError(f"the reference's kept output {fact['name']} lacks its hash")
    return KeptExpected(key=key, tree_sha256={f["name"]: f["tree_sha256"] for f in facts}, **_facts(facts))


def _facts(facts: list) -> dict:
    """The spread and poison count of each kept output, by name, as KeptExpected holds them."""
    for fact in facts:
        if set(fact.get("spread") or {}) != set(STATS_FIELDS) or not isinstance(fact.get("poison_count"), int):
            raise jobs.AnswerError(f"the reference's kept output {fact.get('name')} lacks its spread or poison count")
    return {"spread": {f["name"]: {k: int(v) for k, v in f["spread"].items()} for f in facts},
            "poison_count": {f["name"]: f["poison_count"] for f in facts}}


def _read_judged(answer: dict, layout: jobs.Layout, kept: KeptExpected, atols: dict[str, float]) -> list[OutputDigest]:
    judged = answer.get("judged")
    if not isinstance(judged, list) or len(judged) != len(layout.outputs):
        raise jobs.AnswerError("the judging answer does not name every output")
    digests = []
    for spec, entry in zip(layout.outputs, judged):
        totals = entry.get("totals") if isinstance(entry, dict) else None
        if entry.get("name") != spec.name or not isinstance(totals, dict) or \
                not all(isinstance(totals.get(f), int) for f in TOTALS_FIELDS):
            raise jobs.AnswerError(f"the judging answer for {spec.name} lacks its totals")
        dtype = DTYPES[spec.dtype]
        mismatches = [(int(index), _element(expected, dtype), _element(got, dtype))
                      for index, expected, got in entry.get("mismatches") or []]
        digests.append(digest_from_totals(spec.name, spec.shape, {f: totals[f] for f in TOTALS_FIELDS},
                                          kept.spread[spec.name], mismatches, atols[spec.name]))
    return digests


def _element(hex_bytes: str, dtype: np.dtype) -> float:
    raw = bytes.fromhex(hex_bytes)
    if len(raw) != dtype.itemsize:
        raise jobs.AnswerError("a reported element has the wrong size")
    return float(np.frombuffer(raw, dtype=dtype)[0])
