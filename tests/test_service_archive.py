"""Uploaded task archives: each attack is crafted here and refused with its member and rule; honest ones unpack."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from service.archive import ArchiveLimits, ArchiveRefused, ArchiveRule, task_root, unpack_archive


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


def _zip(members: list[tuple[str, bytes]], unix_mode: int | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if unix_mode is not None:
                info.create_system, info.external_attr = 3, unix_mode << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def _refused(data: bytes, dest: Path, limits: ArchiveLimits | None = None) -> ArchiveRefused:
    with pytest.raises(ArchiveRefused) as caught:
        unpack_archive(data, dest, limits)
    return caught.value


def test_an_honest_tar_gz_and_zip_unpack_to_the_same_files(tmp_path):
    members = [("mytask/task.toml", b"name = 'x'\n"), ("mytask/kernels/ref.cu", b"__global__ void k() {}\n")]
    tar = _tar([_file(n, d) for n, d in members])
    written = unpack_archive(tar, tmp_path / "t")
    assert [str(p) for p in written] == ["mytask/kernels/ref.cu", "mytask/task.toml"]
    assert unpack_archive(_zip(members), tmp_path / "z") == written
    assert task_root(tmp_path / "z") == tmp_path / "z" / "mytask"
    assert (tmp_path / "z/mytask/kernels/ref.cu").read_bytes() == members[1][1]


@pytest.mark.parametrize("name, rule", [
    ("/etc/cron.d/evil", ArchiveRule.ABSOLUTE_PATH),
    ("C:/evil", ArchiveRule.ABSOLUTE_PATH),
    ("../evil", ArchiveRule.PARENT_PATH),
    ("task/../../evil", ArchiveRule.PARENT_PATH),
    ("task\\..\\evil", ArchiveRule.UNSAFE_NAME),
])
@pytest.mark.parametrize("form", ["tar", "zip"])
def test_a_path_out_of_the_folder_is_refused_and_nothing_escapes(tmp_path, name, rule, form):
    data = _tar([_file(name, b"x")]) if form == "tar" else _zip([(name, b"x")])
    refusal = _refused(data, tmp_path / "out")
    assert (refusal.member, refusal.rule) == (name, rule)
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("kind, rule", [
    (tarfile.SYMTYPE, ArchiveRule.LINK), (tarfile.LNKTYPE, ArchiveRule.LINK),
    (tarfile.CHRTYPE, ArchiveRule.SPECIAL_FILE), (tarfile.BLKTYPE, ArchiveRule.SPECIAL_FILE),
    (tarfile.FIFOTYPE, ArchiveRule.SPECIAL_FILE),
])
def test_tar_links_devices_and_fifos_are_refused(tmp_path, kind, rule):
    refusal = _refused(_tar([_special("task/x", kind, "/etc/passwd")]), tmp_path / "out")
    assert (refusal.member, refusal.rule) == ("task/x", rule)
    assert not (tmp_path / "out/task/x").exists()


def test_a_link_then_a_write_through_it_stops_at_the_link(tmp_path):
    data = _tar([_special("task/l", tarfile.SYMTYPE, str(tmp_path)), _file("task/l/evil", b"x")])
    assert _refused(data, tmp_path / "out").rule is ArchiveRule.LINK
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("mode, rule", [(stat.S_IFLNK | 0o777, ArchiveRule.LINK),
                                        (stat.S_IFIFO | 0o644, ArchiveRule.SPECIAL_FILE)])
def test_zip_links_and_fifos_are_refused(tmp_path, mode, rule):
    refusal = _refused(_zip([("task/x", b"/etc/passwd")], unix_mode=mode), tmp_path / "out")
    assert (refusal.member, refusal.rule) == ("task/x", rule)


def test_too_many_files_are_refused_at_the_first_over(tmp_path):
    data = _tar([_file(f"f{i}", b"x") for i in range(6)])
    refusal = _refused(data, tmp_path / "out", ArchiveLimits(max_files=5))
    assert (refusal.member, refusal.rule) == ("f5", ArchiveRule.FILE_COUNT)


def test_a_tar_bomb_is_refused_on_its_ratio_before_it_is_inflated(tmp_path):
    data = _tar([_file(f"zeros{i}", bytes(4 << 20)) for i in range(4)])   # 16 MiB of zeros in ~16 kB
    assert len(data) < 64 << 10
    refusal = _refused(data, tmp_path / "out")
    assert refusal.rule is ArchiveRule.RATIO
    written = sum(p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert written <= ArchiveLimits().ratio_floor_bytes + (1 << 16) + len(data) * ArchiveLimits().max_ratio


def test_a_zip_bomb_is_refused_on_its_ratio(tmp_path):
    refusal = _refused(_zip([("zeros", bytes(8 << 20))]), tmp_path / "out")
    assert (refusal.member, refusal.rule) == ("zeros", ArchiveRule.RATIO)


def test_total_and_member_sizes_are_limited(tmp_path):
    rand = bytes(range(256)) * 64  # 16 kB, barely compressible under these limits' ratio floor
    limits = ArchiveLimits(max_total_bytes=40_000, ratio_floor_bytes=1 << 30)
    refusal = _refused(_tar([_file(f"f{i}", rand) for i in range(3)]), tmp_path / "a", limits)
    assert (refusal.member, refusal.rule) == ("f2", ArchiveRule.TOTAL_SIZE)
    limits = ArchiveLimits(max_member_bytes=10_000, ratio_floor_bytes=1 << 30)
    assert _refused(_zip([("big", rand)]), tmp_path / "b", limits).rule is ArchiveRule.MEMBER_SIZE


def test_a_zip_whose_header_understates_its_size_is_refused(tmp_path):
    data = bytearray(_zip([("f", b"a" * 5000)]))
    local = data.index(b"PK\x03\x04")
    central = data.index(b"PK\x01\x02")
    data[local + 22:local + 26] = (10).to_bytes(4, "little")        # uncompressed size in the local header
    data[central + 24:central + 28] = (10).to_bytes(4, "little")    # ... and in the central directory
    refusal = _refused(bytes(data), tmp_path / "out", ArchiveLimits(ratio_floor_bytes=1 << 30))
    assert (refusal.member, refusal.rule) in {("f", ArchiveRule.MEMBER_SIZE), ("f", ArchiveRule.FORMAT)}
    assert not (tmp_path / "out/f").exists() or (tmp_path / "out/f").stat().st_size <= 10


def test_a_duplicate_member_is_refused(tmp_path):
    refusal = _refused(_tar([_file("task.toml", b"a"), _file("./task.toml", b"b")]), tmp_path / "out")
    assert (refusal.member, refusal.rule) == ("./task.toml", ArchiveRule.DUPLICATE)


def test_garbage_is_refused_as_a_format(tmp_path):
    assert _refused(b"not an archive at all", tmp_path / "out").rule is ArchiveRule.FORMAT
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArchiveRefused):
        task_root(tmp_path / "empty")
