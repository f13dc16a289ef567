"""The scripted agent waits out a new run's preparation (server/preparation.py) before its first step, as a client
told "preparing" should: on a GPU the baseline's timing takes longer than a tool's own short wait."""

from types import SimpleNamespace

import anyio
import pytest

from server.demo import DemoError, _until_prepared


class Answers:
    """A client whose describe_task answers the given preparation states in turn."""

    def __init__(self, *states: str):
        self.states = list(states)
        self.calls = 0

    async def call_tool(self, tool, arguments, progress_callback=None):
        assert tool == "describe_task"
        state = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        preparation = {"state": state, "step": "timing the baseline", "error": "the reference faulted"}
        return SimpleNamespace(is_error=False, structured_content={"name": "t", "preparation": preparation})


def _wait(client, patience_s=5.0):
    said = []
    result = anyio.run(lambda: _until_prepared(client, said.append, poll_s=0.01, patience_s=patience_s))
    return result, said


def test_the_demo_polls_describe_task_until_the_run_is_ready():
    client = Answers("preparing", "preparing", "preparing", "ready")
    description, said = _wait(client)
    assert description["preparation"]["state"] == "ready"
    assert client.calls == 4
    assert said == ["the run is being prepared (timing the baseline); waiting"]


def test_a_failed_preparation_stops_the_demo_with_its_cause():
    with pytest.raises(DemoError, match="could not be prepared: the reference faulted"):
        _wait(Answers("preparing", "failed"))


def test_a_preparation_that_never_ends_stops_the_demo_after_its_patience():
    with pytest.raises(DemoError, match="still being prepared after 0 s"):
        _wait(Answers("preparing"), patience_s=0.05)
