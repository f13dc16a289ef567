"""A store with one approval made from a real CPU run (the fake executor), for the approval and store tests."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from guard.approve import ApproveOptions, approve
from guard.signing import generate
from guard.store import keys_dir
from tests.fake_executor import FakeExecutor
from tests.server_support import kernel
from tests.test_replay import make_run

NAME = "matmul-best"


def fake(task, timing):
    return FakeExecutor(task, gpu="Fake GPU")


def no_gpu() -> str:
    return "no NVIDIA driver library (libcuda) on this machine"


def new_store(root: Path) -> tuple[Path, Path]:
    """An empty store trusting one new key; (the store, the private key)."""
    store = root / "store"
    private, public, _ = generate(root / "keys")
    keys_dir(store).mkdir(parents=True)
    shutil.copy(public, keys_dir(store) / public.name)
    return store, private


def good_run(root: Path) -> Path:
    return make_run(root, kernel("latency_us=50"))


def approved(root: Path, run_dir: Path, **options) -> tuple[int, Path, Path, str]:
    """(exit status, the store, the key, what approve printed): the run's best approved with the fake's replay."""
    store, key = new_store(root)
    out = io.StringIO()
    options = {"make_executor": fake, "repeats": 1, **options}
    code = approve(ApproveOptions(run=run_dir, store=store, name=NAME, key=key, **options), out)
    return code, store, key, out.getvalue()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished run with a faster attempt (`good_run`), made once per test module."""
    return good_run(tmp_path_factory.mktemp("run"))


@pytest.fixture
def fresh_run(run_dir, tmp_path):
    """A copy of the module's run, for a test that adds to it."""
    return shutil.copytree(run_dir, tmp_path / "run-001")
