"""Unpack a task archive a team uploads (.tar.gz or .zip), refusing what could escape or exhaust the host.

An archive is untrusted input: a member may name a path outside the destination (absolute, `..`), be a link
that a later member writes through, a device or fifo, or expand to far more than it weighs (a bomb). Each is
refused with the member's name and the rule it broke, before anything of that member is written; declared
sizes are checked before reading, and the bytes actually written are counted too, since a zip's header may lie.
"""

from __future__ import annotations

import enum
import io
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

_CHUNK_BYTES = 1 << 16


class ArchiveRule(str, enum.Enum):
    FORMAT = "format"                 # neither a gzip'd (or plain) tar nor a zip
    ABSOLUTE_PATH = "absolute_path"   # /etc/passwd, C:\..., \\server\share
    PARENT_PATH = "parent_path"       # a `..` component
    UNSAFE_NAME = "unsafe_name"       # empty, NUL, backslash: read differently by different tools
    LINK = "link"                     # symbolic or hard link
    SPECIAL_FILE = "special_file"     # device, fifo, socket
    DUPLICATE = "duplicate"           # a second member with the same path would overwrite the first
    FILE_COUNT = "file_count"
    MEMBER_SIZE = "member_size"
    TOTAL_SIZE = "total_size"
    RATIO = "ratio"                   # expands to more than max_ratio times the archive's size


class ArchiveLimits(BaseModel):
    max_total_bytes: int = 64 << 20
    max_member_bytes: int = 32 << 20
    max_files: int = 1000
    max_ratio: float = 100.0
    # Below this, a high ratio is harmless (a 20 kB cases file of zeros compresses a thousandfold).
    ratio_floor_bytes: int = 1 << 20


class ArchiveRefused(ValueError):
    """The archive breaks one of the unpacking rules; nothing more of it is written."""

    def __init__(self, member: str, rule: ArchiveRule, detail: str):
        self.member, self.rule, self.detail = member, rule, detail
        super().__init__(f"archive member {member!r} refused ({rule.value}): {detail}")


def safe_member_path(name: str) -> PurePosixPath:
    """The relative path a member names, or ArchiveRefused."""
    if not name or "\x00" in name or "\\" in name:
        raise ArchiveRefused(name, ArchiveRule.UNSAFE_NAME, "empty names, NUL and backslashes are not accepted")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise ArchiveRefused(name, ArchiveRule.ABSOLUTE_PATH, "member paths must be relative")
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if ".." in parts:
        raise ArchiveRefused(name, ArchiveRule.PARENT_PATH, "member paths must not climb out with '..'")
    if not parts:
        raise ArchiveRefused(name, ArchiveRule.UNSAFE_NAME, "the member names no file")
    return PurePosixPath(*parts)


class _Budget:
    """What the archive has written so far, against the limits."""

    def __init__(self, limits: ArchiveLimits, archive_bytes: int):
        self.limits, self.archive_bytes = limits, max(archive_bytes, 1)
        self.files, self.total, self.seen = 0, 0, set()

    def admit(self, name: str, path: PurePosixPath, declared: int) -> None:
        if path in self.seen:
            raise ArchiveRefused(name, ArchiveRule.DUPLICATE, "a member with this path came earlier")
        self.seen.add(path)
        self.files += 1
        if self.files > self.limits.max_files:
            raise ArchiveRefused(name, ArchiveRule.FILE_COUNT, f"more than {self.limits.max_files} members")
        self._check_sizes(name, declared, self.total + declared)

    def add(self, name: str, written: int) -> None:
        self.total += written
        self._check_sizes(name, written, self.total)

    def _check_sizes(self, name: str, member: int, total: int) -> None:
        lim = self.limits
        if member > lim.max_member_bytes:
            raise ArchiveRefused(name, ArchiveRule.MEMBER_SIZE, f"more than {lim.max_member_bytes} bytes")
        if total > lim.max_total_bytes:
            raise ArchiveRefused(name, ArchiveRule.TOTAL_SIZE, f"the archive expands past {lim.max_total_bytes} bytes")
        if total > lim.ratio_floor_bytes and total / self.archive_bytes > lim.max_ratio:
            raise ArchiveRefused(name, ArchiveRule.RATIO,
                                 f"expands more than {lim.max_ratio:g} times its {self.archive_bytes} bytes")


def _write(source, target: Path, name: str, budget: _Budget, declared: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(target, "xb") as out:  # "x": never through something already there
        while chunk := source.read(_CHUNK_BYTES):
            written += len(chunk)
            if written > declared:
                raise ArchiveRefused(name, ArchiveRule.MEMBER_SIZE, f"holds more than its declared {declared} bytes")
            budget.add(name, len(chunk))
            out.write(chunk)


def _unpack_tar(data: bytes, dest: Path, budget: _Budget) -> None:
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except tarfile.TarError as exc:
        raise ArchiveRefused("", ArchiveRule.FORMAT, f"not a readable tar: {exc}") from None
    with archive:
        # Iterating reads one header at a time: the limits stop a bomb before its later members are inflated.
        for member in archive:
            path = safe_member_path(member.name)
            if member.issym() or member.islnk():
                raise ArchiveRefused(member.name, ArchiveRule.LINK, f"links to {member.linkname!r}")
            if member.isdir():
                (dest / path).mkdir(parents=True, exist_ok=True)
                continue
            if not member.isfile():
                raise ArchiveRefused(member.name, ArchiveRule.SPECIAL_FILE, "only plain files and folders")
            budget.admit(member.name, path, member.size)
            _write(archive.extractfile(member), dest / path, member.name, budget, member.size)


def _zip_kind(info: zipfile.ZipInfo) -> int:
    return stat.S_IFMT(info.external_attr >> 16) if info.create_system == 3 else 0  # 3: made on Unix


def _unpack_zip(data: bytes, dest: Path, budget: _Budget) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ArchiveRefused("", ArchiveRule.FORMAT, f"not a readable zip: {exc}") from None
    with archive:
        for info in archive.infolist():
            path = safe_member_path(info.filename)
            kind = _zip_kind(info)
            if kind == stat.S_IFLNK:
                raise ArchiveRefused(info.filename, ArchiveRule.LINK, "a symbolic link")
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise ArchiveRefused(info.filename, ArchiveRule.SPECIAL_FILE, "only plain files and folders")
            if info.is_dir() or kind == stat.S_IFDIR:
                (dest / path).mkdir(parents=True, exist_ok=True)
                continue
            budget.admit(info.filename, path, info.file_size)
            try:
                with archive.open(info) as source:
                    _write(source, dest / path, info.filename, budget, info.file_size)
            except (zipfile.BadZipFile, EOFError) as exc:  # a lying size ends in a CRC mismatch
                raise ArchiveRefused(info.filename, ArchiveRule.FORMAT, f"unreadable: {exc}") from None


def unpack_archive(data: bytes, dest: Path, limits: ArchiveLimits | None = None) -> list[Path]:
    """Unpack `data` (a .tar.gz, .tar or .zip) into the empty folder `dest`; the files written, relative to it.

    Raises ArchiveRefused on the first member that breaks a rule; `dest` may then hold what came before it,
    and the caller removes it.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ValueError(f"{dest} is not empty")
    budget = _Budget(limits or ArchiveLimits(), len(data))
    if data[:4] == b"PK\x03\x04" or data[:4] == b"PK\x05\x06":
        _unpack_zip(data, dest, budget)
    else:
        _unpack_tar(data, dest, budget)
    return sorted(p.relative_to(dest) for p in dest.rglob("*") if p.is_file())


def task_root(folder: Path) -> Path:
    """The folder holding task.toml: the archive's root, or its one top-level folder (`tar czf t.tgz mytask/`)."""
    if (folder / "task.toml").is_file():
        return folder
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / "task.toml").is_file():
        return entries[0]
    raise ArchiveRefused("task.toml", ArchiveRule.FORMAT, "no task.toml at the archive's root or in its one folder")
