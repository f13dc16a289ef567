import os

import pytest
from hypothesis import settings

from harness.device import gpu_absent_reason
from harness.gpu_lease import LEASE_DIR_ENV
from tests import server_support

# Property tests draw the same examples on every run and keep nothing between runs: a failure in CI is a
# failure on any machine, and none depends on a database a previous run left behind (a failure prints the
# blob to reproduce it). HYPOTHESIS_PROFILE=explore draws new examples each run, to look for bugs.
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def pytest_collection_modifyitems(config, items):
    reason = gpu_absent_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _gpu_leases_of_this_session(tmp_path_factory):
    """GPU leases (harness/gpu_lease.py) in a folder of this test session's own: tests running beside each other on
    one host never wait for each other's fake GPU, and no lease file outlives the session's temporary folder."""
    folder = tmp_path_factory.mktemp("gpu-leases")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LEASE_DIR_ENV, str(folder))
        yield folder


@pytest.fixture
def own_gpu_claims(tmp_path, monkeypatch):
    """GPU leases and serving claims in this test's own folder: a service or run of another test, in this process
    or another, never holds one of this test's fake GPUs."""
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "gpu-leases"))


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def run(tmp_path):
    """A new run of matmul_f32 with the fake executor (tests/server_support.py), closed after the test."""
    run = server_support.new_run(tmp_path)
    yield run
    run.close()
