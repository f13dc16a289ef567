"""A candidate: a kernel's source, its NVRTC options and its launch, named by an id made from the three."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from harness.task_model import LaunchSpec


@dataclass(frozen=True)
class Candidate:
    id: str
    source: str
    options: tuple[str, ...]
    launch: LaunchSpec


def candidate_id(source: str, options: tuple[str, ...], launch: LaunchSpec) -> str:
    """Its source, options and launch, hashed: the same candidate has the same id before the run knows it (a
    compile answered while the run waits for a GPU) and after, in every run."""
    identity = {"source": source, "options": options, "launch": launch.model_dump(mode="json")}
    return "c" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:15]
