"""The audit service on this host's GPU (issue 36): two runs submitted together share one GPU through the queue,
each run's timed launches spread no more than a run's alone, and the demo's scripted agent plays every run whole
through the run's own MCP endpoint.

    python bench/service_gpu.py --out service-gpu.json [--gpu 0] [--no-sandbox]

`kernel-referee service` (the real executor) is started on a temporary root with only GPU --gpu visible, so its
queue has one slot. cases/matmul_f32 is submitted twice, back to back, as an archive (POST /api/submissions, lint
included), and both runs are driven at once with the demo's plan over their endpoints (server/demo.py
`session_over_http`): the second waits in the queue while the first plays. Then one run alone on the same service.
Per run: its queue wait and time on the GPU (the service's record), the agent's wall time from submission to its
last answer, each attempt's verdict, every timed case's CV (history.json: each timed attempt's `stats.cv`, the
spread of its launches) and whether the run folder verifies; then, per shared run and case, whether its CV is no
worse than the alone run's (CV_TOLERANCE). Writes JSON to --out and prints a summary; exits 1 where a check fails.
Without a GPU it says so and exits 3, as `check` and `demo` do.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

import anyio
import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.device import gpu_absent_reason  # noqa: E402
from server.demo import PLAN, Say, Step, session_over_http  # noqa: E402
from server.record_files import read_history, read_summary  # noqa: E402
from server.verify import verify_run  # noqa: E402
from service.auth import ADMIN_TOKEN_ENV  # noqa: E402

MATMUL = ROOT / "cases" / "matmul_f32"
EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 3
STARTUP_S = 120.0
SETTLE_S = 120.0   # from an agent's last answer to its run let go by the scheduler
QUEUE_PATIENCE_S = 3600.0  # how long a queued agent waits for its turn: a whole demo run takes minutes
# A shared run's CV on a case may exceed the alone run's by this factor plus this many (a fraction, 0.001 = 0.1
# point). A CV from ~100 launches is itself an estimate: its relative sampling error is about 1/sqrt(2n), 7% for
# normal launches and more for the tailed ones GPUs give, so two runs of the same kernels on an idle GPU differ by
# tens of percent; the median over a run's timed attempts damps that, and 25% is about three of those errors. The
# absolute floor keeps a sub-0.5% CV from failing on a few nanoseconds of clock jitter. Sharing that hurt the
# timings (a queued run's work on the timed GPU) shows as a CV several times the alone run's.
CV_TOLERANCE = {"relative": 0.25, "absolute": 0.001}


class ServiceUnderTest:
    """`command` (a `kernel-referee service --root ROOT --port PORT` or a stand-in) as a subprocess with an admin
    token of its own; the JSON API's few calls this bench makes."""

    def __init__(self, command: list[str], root: Path, port: int, env: dict[str, str] | None = None):
        self.command, self.root, self.port = command, root, port
        self.url = f"http://127.0.0.1:{port}"
        self.admin = secrets.token_urlsafe(24)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), ADMIN_TOKEN_ENV: self.admin, **(env or {})}
        self.stderr_path = root.parent / f"{root.name}-stderr.txt"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServiceUnderTest":
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with {self.proc.returncode}: {self.stderr_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"the service did not accept within {STARTUP_S:.0f} s") from None
                time.sleep(0.2)

    def __exit__(self, *_) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def stderr_tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def _api(self) -> httpx2.Client:
        return httpx2.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.admin}"}, timeout=300)

    def submit(self, archive: bytes, max_attempts: int, note: str) -> dict:
        """POST /api/submissions: the run made from the archive, queued; its record and connection (URL, token)."""
        with self._api() as http:
            answer = http.post("/api/submissions", json={"archive_base64": base64.b64encode(archive).decode(),
                                                         "max_attempts": max_attempts, "note": note})
        if answer.status_code != 201:
            raise RuntimeError(f"the submission was refused ({answer.status_code}): {answer.text}")
        return answer.json()

    def until_settled(self, run_id: str, timeout_s: float = SETTLE_S) -> dict:
        """The run's record once finished or failed (the scheduler has let its GPU go)."""
        deadline = time.monotonic() + timeout_s
        with self._api() as http:
            while True:
                record = http.get(f"/api/runs/{run_id}").json()["run"]
                if record["state"] in ("finished", "failed"):
                    return record
                if time.monotonic() > deadline:
                    raise RuntimeError(f"run {run_id} still {record['state']} after {timeout_s:.0f} s")
                time.sleep(0.5)

    def run_dir(self, run_id: str) -> Path:
        return next((self.root / "runs" / run_id / "results").glob("run-*"))


def service_command(root: Path, port: int, confine: bool = True) -> list[str]:
    """`kernel-referee service` of this installation, or of this checkout where no script is installed."""
    args = ["service", "--root", str(root), "--port", str(port)] + ([] if confine else ["--no-sandbox"])
    script = Path(sys.executable).with_name("kernel-referee")
    if script.is_file():
        return [str(script), *args]
    return [sys.executable, "-c", "import sys; from server.entry import main; sys.exit(main())", *args]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def task_archive(task_dir: Path) -> bytes:
    """The task folder as the .tar.gz a team uploads (its one folder at the archive's root)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        archive.add(task_dir, arcname=task_dir.name, filter=lambda m: None if "__pycache__" in m.name else m)
    return out.getvalue()


async def play_together(service: ServiceUnderTest, roles: tuple[str, ...], plan: tuple[Step, ...], say: Say,
                        patience_s: float = QUEUE_PATIENCE_S) -> list[dict]:
    """One run per role submitted back to back, then every run's agent driving at once; per run its submission,
    the seconds from submission to the agent's last answer, and the agent's error where it stopped early."""
    archive = task_archive(MATMUL)
    played = []
    for role in roles:
        made = await anyio.to_thread.run_sync(service.submit, archive, len(plan), f"bench {role}")
        played.append({"role": role, "made": made, "submitted": time.monotonic(), "wall_s": None, "error": None})

    async def agent(entry: dict) -> None:
        connection = entry["made"]["connection"]
        try:
            await session_over_http(connection["url"], connection["token"], plan,
                                    lambda line: say(f"[{entry['role']}] {line}"), patience_s)
        except Exception as exc:  # noqa: BLE001 - one agent's stop is this run's result; the others go on
            entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["wall_s"] = time.monotonic() - entry["submitted"]

    async with anyio.create_task_group() as group:
        for entry in played:
            group.start_soon(agent, entry)
    return played


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def run_report(service: ServiceUnderTest, entry: dict, plan: tuple[Step, ...]) -> dict:
    """What one played run came to: the service's record of it, its attempts and the spread of its timings."""
    run_id = entry["made"]["run"]["id"]
    record = service.until_settled(run_id)
    run_dir = service.run_dir(run_id)
    history, summary = read_history(run_dir), read_summary(run_dir)
    labels = {0: "baseline", **{number: step.label for number, step in enumerate(plan, 1)}}
    attempts, cv_by_case = [], {}
    for a in history.attempts:
        cvs = {case: row.stats.cv for case, row in (a.timing or {}).items() if row.stats and row.stats.cv is not None}
        for case, cv in cvs.items():
            cv_by_case.setdefault(case, []).append(cv)
        speedup = a.speedup_vs_baseline.ratio if a.speedup_vs_baseline else None
        attempts.append({"attempt": a.attempt, "label": labels.get(a.attempt), "verdict": _text(a.verdict),
                         "reasons": [_text(r.code) for r in a.reasons], "speedup_vs_baseline": speedup, "cv": cvs})
    verified = verify_run(run_dir)
    return {"role": entry["role"], "run": run_id, "state": record["state"], "agent_error": entry["error"],
            "queued_at": record["queued_at"], "started_at": record["started_at"], "finished_at": record["finished_at"],
            "queue_wait_s": _seconds_between(record["queued_at"], record["started_at"]),
            "gpu_s": _seconds_between(record["started_at"], record["finished_at"]),
            "wall_s": entry["wall_s"], "budget": summary.budget, "attempts": attempts,
            "case_cv": {case: statistics.median(cvs) for case, cvs in sorted(cv_by_case.items())},
            "verified": verified.ok, "verify_problems": verified.problems[:5], "run_dir": str(run_dir)}


def _text(value) -> str | None:
    return None if value is None else getattr(value, "value", value)


def compare_spread(shared: list[dict], alone: dict, tolerance: dict = CV_TOLERANCE) -> list[dict]:
    """Per shared run and case: its median CV against the alone run's, with the limit it must keep under."""
    rows = []
    for run in shared:
        for case, alone_cv in alone["case_cv"].items():
            shared_cv = run["case_cv"].get(case)
            limit = alone_cv * (1 + tolerance["relative"]) + tolerance["absolute"]
            rows.append({"run": run["role"], "case": case, "shared_cv": shared_cv, "alone_cv": alone_cv,
                         "limit": limit, "no_worse": shared_cv is not None and shared_cv <= limit})
    return rows


def measure(service: ServiceUnderTest, plan: tuple[Step, ...], say: Say, patience_s: float = QUEUE_PATIENCE_S,
            keep: Callable[[dict], None] | None = None) -> dict:
    """Two runs together, then one alone, on the started service; the report's JSON. `keep` is handed the shared
    runs' part as soon as they are done, so a slot that ends during the alone run still leaves them."""
    together = anyio.run(play_together, service, ("shared-1", "shared-2"), plan, say, patience_s)
    shared = [run_report(service, entry, plan) for entry in together]
    if keep is not None:
        keep({"plan": [step.label for step in plan], "incomplete": "the alone run had not finished", "runs": shared})
    alone = run_report(service, anyio.run(play_together, service, ("alone",), plan, say, patience_s)[0], plan)
    first, second = shared
    spread = compare_spread(shared, alone)
    checks = {
        "every_agent_played_whole": all(r["agent_error"] is None for r in (*shared, alone)),
        "every_budget_spent": all(r["budget"] and r["budget"]["left"] == 0 for r in (*shared, alone)),
        "every_run_verifies": all(r["verified"] for r in (*shared, alone)),
        # one GPU, one slot: the second run got it only once the first had let it go
        "shared_through_the_queue": bool(first["finished_at"] and second["started_at"]
                                         and second["started_at"] >= first["finished_at"]),
        "shared_cv_no_worse": bool(spread) and all(row["no_worse"] for row in spread),
    }
    return {"plan": [step.label for step in plan], "cv_tolerance": CV_TOLERANCE, "checks": checks,
            "runs": [*shared, alone], "spread": spread}


def summary_lines(report: dict) -> list[str]:
    lines = []
    for run in report["runs"]:
        verdicts = ", ".join(f"{a['attempt']}:{a['verdict']}" for a in run["attempts"])
        cvs = ", ".join(f"{case} {cv:.2%}" for case, cv in run["case_cv"].items())
        lines.append(f"{run['role']}: queue wait {_s(run['queue_wait_s'])}, on the GPU {_s(run['gpu_s'])}, wall "
                     f"{_s(run['wall_s'])}; verdicts {verdicts}; median CV {cvs}; verifies {run['verified']}"
                     + (f"; agent stopped: {run['agent_error']}" if run["agent_error"] else ""))
    lines += [f"{row['run']} {row['case']}: CV {_pct(row['shared_cv'])} vs alone {_pct(row['alone_cv'])} "
              f"(limit {_pct(row['limit'])}): {'no worse' if row['no_worse'] else 'WORSE'}" for row in report["spread"]]
    lines += [f"{name}: {'yes' if ok else 'NO'}" for name, ok in report["checks"].items()]
    return lines


def _s(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.0f} s"


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.2%}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="where the JSON report goes")
    p.add_argument("--gpu", default="0", help="the one GPU the service may use (CUDA_VISIBLE_DEVICES: index or "
                   "UUID); default 0")
    p.add_argument("--no-sandbox", action="store_true", help="the service's GPU workers unconfined")
    p.add_argument("--root", type=Path, help="the service's folder, kept with its run folders (default: a temporary "
                   "one, removed at the end)")
    args = p.parse_args(argv)
    absent = gpu_absent_reason()
    if absent is not None:
        print(f"service_gpu: no GPU: {absent}. This bench times real runs and needs an NVIDIA GPU.", file=sys.stderr)
        return EXIT_NO_GPU

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="service-gpu-") as work:
        root, port = (args.root or Path(work) / "service").resolve(), free_port()
        root.parent.mkdir(parents=True, exist_ok=True)
        service = ServiceUnderTest(service_command(root, port, confine=not args.no_sandbox), root, port,
                                   env={"CUDA_VISIBLE_DEVICES": args.gpu})
        try:
            with service:
                report = measure(service, PLAN, say, keep=lambda part: args.out.write_text(json.dumps(part, indent=2)))
        except Exception:
            print(f"service_gpu: the service's stderr ends:\n{service.stderr_tail()}", file=sys.stderr)
            raise
    args.out.write_text(json.dumps(report, indent=2))
    print("\n".join(summary_lines(report)))
    print(f"written: {args.out}")
    return EXIT_OK if all(report["checks"].values()) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
