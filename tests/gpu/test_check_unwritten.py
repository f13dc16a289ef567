"""`kernel-referee check` on a real GPU, of a task whose reference leaves half of its output unwritten: refused
with that cause, not as a reference that is not deterministic."""

import re
import shutil
from pathlib import Path

import pytest

from server.cli import main

pytestmark = pytest.mark.gpu

SAXPY = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "saxpy"
ORACLE = ("import numpy as np\n\n\ndef oracle(inputs, dims):\n"
          "    return {'out': 2.5 * inputs['x'].astype(np.float64) + inputs['y'].astype(np.float64)}\n")


def test_check_of_a_reference_leaving_outputs_unwritten_names_that_cause(tmp_path, capsys):
    folder = tmp_path / "saxpy-half"
    shutil.copytree(SAXPY, folder)
    (folder / "oracle.py").write_text(ORACLE)
    toml = folder / "task.toml"
    toml.write_text('oracle = "oracle.py"\n' + toml.read_text())
    reference = folder / "reference.cu"
    text = reference.read_text()
    assert "if (i < n) {" in text
    reference.write_text(text.replace("if (i < n) {", "if (i < n / 2) {"))
    assert main(["check", str(folder), "--iterations", "10"]) == 2
    err = capsys.readouterr().err
    # the first case the reference runs on is odd (n 1001, 501 left), judged on the host; a case judged on the
    # device (harness/device_checks.py) says the same with its own counts
    assert re.search(r"the task's reference kernel failed on case \w+: it leaves \d+ of \d+ elements of out "
                     r"unwritten \(first at \[\d+\]; they still hold the poison after both runs\)", err), err
    assert "not deterministic" not in err
