import pytest

from harness.device import gpu_absent_reason


def pytest_collection_modifyitems(config, items):
    reason = gpu_absent_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
