"""`kernel-referee service` answers bad input as every command does (README, "Exit codes"): one line on stderr,
no traceback, exit 2 for bad arguments or a --root that cannot be made, 5 for a port another process listens
on; in each case nothing is made under --root."""

from __future__ import annotations

import socket
import sys

import pytest

from service import cli as service_cli
from tests.server_support import free_port


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("port", "said"), [("x", "'x' is not a whole number"), ("70000", "out of range"),
                                            ("0", "out of range")])
def test_a_bad_port_is_one_line_and_exit_2(tmp_path, capsys, port, said):
    with pytest.raises(SystemExit) as stopped:
        service_cli.main(["--root", str(tmp_path / "svc"), "--port", port, "--no-sandbox"])
    assert stopped.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("kernel-referee service: argument --port:") and said in line
    assert not (tmp_path / "svc").exists()


def test_a_root_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    code = service_cli.main(["--root", str(tmp_path / "a-file" / "svc"), "--port", str(free_port()), "--no-sandbox"])
    assert code == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("kernel-referee service: ") and "a-file" in line and "internal error" not in line


def test_a_busy_port_is_refused_with_exit_5_before_anything_is_made(tmp_path, capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        code = service_cli.main(["--root", str(tmp_path / "svc"), "--port", str(port), "--no-sandbox"])
    finally:
        taken.close()
    assert code == 5
    line = _one_line(capsys.readouterr().err)
    assert f"port {port} on 127.0.0.1 is in use by another process" in line
    assert not (tmp_path / "svc").exists()


def test_ray_asked_for_without_the_fleet_extra_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where the extra is not installed
    code = service_cli.main(["--root", str(tmp_path / "svc"), "--port", str(free_port()), "--ray", "auto",
                             "--no-sandbox"])
    assert code == 2
    line = _one_line(capsys.readouterr().err)
    assert "pip install 'kernel-referee[fleet]'" in line and "internal error" not in line
    assert not (tmp_path / "svc").exists()


def test_a_busy_port_is_refused_before_a_cluster_is_joined(tmp_path, capsys, monkeypatch):
    joined = []
    monkeypatch.setattr(service_cli, "join_fleet", lambda *args: joined.append(args))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = service_cli.main(["--root", str(tmp_path / "svc"), "--port", str(taken.getsockname()[1]),
                                 "--ray", "auto", "--no-sandbox"])
    assert code == 5 and joined == []
    assert "is in use by another process" in _one_line(capsys.readouterr().err)
