"""A new run's folder moves into place (results/.preparing-* renamed to results/run-NNN) while its server already
answers describe_task: a read of the folder's attempts in that moment waits for `dir` to follow the rename,
rather than list a folder that is gone (server/lifecycle.py `_move_into_place`, server/run.py), and the resource
watcher, made before the move, watches the moved folder."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

from mcp.server.subscriptions import InMemorySubscriptionBus

from server import lifecycle
from server.preparation import described
from server.resource_updates import ResourceUpdates
from server.run import RunSettings
from tests.server_support import MATMUL, executor


def test_the_budget_read_while_the_folder_moves_waits_for_it(tmp_path, monkeypatch):
    run = lifecycle.begin_new_run(MATMUL, tmp_path / "results", RunSettings(), executor())
    preparing = run.dir
    updates = ResourceUpdates(lambda: run.dir, InMemorySubscriptionBus())  # as the server makes it, before the move
    answers: list = []
    errors: list[BaseException] = []

    def read_budget() -> None:
        try:
            answers.append(run.budget())
        except BaseException as error:  # noqa: BLE001 - the test reports what the reader met
            errors.append(error)

    rename = os.rename

    def rename_then_read(source, destination):
        rename(source, destination)  # the folder has moved; run.dir still names the old one
        reader = threading.Thread(target=read_budget)
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not errors, errors  # it waits for dir rather than fail on the old folder
        readers.append(reader)

    readers: list[threading.Thread] = []
    monkeypatch.setattr(lifecycle, "os", SimpleNamespace(rename=rename_then_read, getpid=os.getpid))
    try:
        lifecycle.prepare_new_run(run, tmp_path / "results")
        readers[0].join(5)
        assert not errors and answers[0].attempts_used == 0 and answers[0].attempts_left == 7
        assert run.dir.name == "run-001" and not preparing.exists()
        assert described(run).budget.attempts_used == 0
        seen = updates._look()
        assert seen["history.json"] is not None and seen["events.jsonl"] is not None  # the moved folder's files
    finally:
        run.close()
