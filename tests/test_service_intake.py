"""Intake: a submitted archive or new-task's fields become a linted task folder, or a refusal whose causes are
lint's (or the archive's, or new-task's) own lines; the connection lines follow docs/clients.md."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from service.intake import IntakeRefused, NewTaskFields, Submission, connection, prepare_task
from tests.test_new_task import CASES, MATMUL, SIGNATURE

REPO = Path(__file__).resolve().parents[1]
TRANSPOSE = REPO / "cases" / "transpose_f32"


def task_archive(folder: Path, replace: dict[str, str] | None = None) -> bytes:
    """`folder` as `tar czf t.tgz NAME/` makes it, with some files' text replaced."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(folder.iterdir()):
            data = (replace or {}).get(path.name, path.read_text()).encode()
            info = tarfile.TarInfo(f"{folder.name}/{path.name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


ZERO_ORACLE = ("import numpy as np\n\ndef oracle(inputs, dims):\n"
               "    return {'out': np.zeros((dims['cols'], dims['rows']))}\n")


def test_a_task_archive_is_unpacked_and_linted_with_its_warnings_kept(tmp_path):
    prepared = prepare_task(Submission(archive=task_archive(TRANSPOSE), max_attempts=7), tmp_path / "work")
    assert prepared.task.name == "transpose_f32"
    assert (prepared.folder / "task.toml").is_file() and prepared.folder.is_relative_to(tmp_path / "work")
    assert any(line.startswith("warning: too-small:") for line in prepared.warnings)


def test_lint_refuses_a_task_whose_oracle_computes_nothing_with_lints_own_lines(tmp_path):
    data = task_archive(TRANSPOSE, {"oracle.py": ZERO_ORACLE})
    with pytest.raises(IntakeRefused) as caught:
        prepare_task(Submission(archive=data, max_attempts=7), tmp_path / "work")
    assert caught.value.summary == "lint refuses task transpose_f32"
    assert caught.value.causes and all(c.startswith("error: ") for c in caught.value.causes)
    assert not (tmp_path / "work").exists()  # nothing of a refused submission is left


def test_an_archive_attack_is_a_refusal_naming_the_member(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.addfile(tarfile.TarInfo("../task.toml"), io.BytesIO(b""))
    with pytest.raises(IntakeRefused) as caught:
        prepare_task(Submission(archive=buffer.getvalue(), max_attempts=7), tmp_path / "work")
    assert "'../task.toml'" in caught.value.causes[0] and "parent_path" in caught.value.causes[0]


def test_a_manifest_that_does_not_load_is_refused_with_its_field(tmp_path):
    data = task_archive(TRANSPOSE, {"task.toml": 'name = "x"\n'})
    with pytest.raises(IntakeRefused) as caught:
        prepare_task(Submission(archive=data, max_attempts=7), tmp_path / "work")
    assert caught.value.summary == "the task does not load" and caught.value.causes[0]


def _fields(**changes) -> NewTaskFields:
    given = dict(name="matmul_team", description="Row-major float32 C = A B.", signature=SIGNATURE,
                 reference_cu=(MATMUL / "reference.cu").read_text(), initial_cu=(MATMUL / "initial.cu").read_text(),
                 oracle_py=(MATMUL / "oracle.py").read_text(), cases_json=json.dumps(CASES))
    return NewTaskFields(**(given | changes))


def test_new_task_fields_make_a_task(tmp_path):
    prepared = prepare_task(Submission(fields=_fields(), max_attempts=3), tmp_path / "work")
    assert prepared.task.name == "matmul_team"
    assert (prepared.folder / "oracle.py").read_text() == (MATMUL / "oracle.py").read_text()


def test_new_tasks_own_error_is_the_cause(tmp_path):
    with pytest.raises(IntakeRefused) as caught:
        prepare_task(Submission(fields=_fields(cases_json="{not json"), max_attempts=3), tmp_path / "work")
    assert "not valid JSON" in caught.value.causes[0]


def test_a_submission_is_one_of_the_two_forms(tmp_path):
    with pytest.raises(IntakeRefused):
        prepare_task(Submission(max_attempts=3), tmp_path / "work")


def test_the_connection_lines_carry_the_runs_url_and_token():
    made = connection("r-0001", "http://127.0.0.1:8000/runs/r-0001/mcp", "tok")
    assert made.claude_command == ('claude mcp add --transport http kernel-referee-r-0001 '
                                   'http://127.0.0.1:8000/runs/r-0001/mcp --header "Authorization: Bearer tok"')
    server = json.loads(made.mcp_json)["mcpServers"]["kernel-referee-r-0001"]
    assert server == {"type": "http", "url": "http://127.0.0.1:8000/runs/r-0001/mcp",
                      "headers": {"Authorization": "Bearer tok"}}
