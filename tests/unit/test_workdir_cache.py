"""Shipping an unchanged directory again costs a listing, not a pack: the client's cache takes the
digest of the last archive packed from a directory against its listing, and the archive is the same
with the cache as without it. The fleet's blob store here is a dict (the upload itself is tested
through the API in tests/integration/test_workdir.py)."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import time
from pathlib import Path

import pytest

from fleet.client import cache
from fleet.client.workdir import Shipped, pack, ship
from fleet.workdir import digest_of

HOUR_AGO = time.time() - 3600


class Fleet:
    """The blobs a fleet holds, and what was uploaded to it."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.uploads: list[str] = []

    def holds(self, digest: str) -> bool:
        return digest in self.blobs

    def put(self, digest: str, data: bytes) -> None:
        assert digest_of(data) == digest
        self.blobs[digest] = data
        self.uploads.append(digest)

    def ship(self, root: Path) -> Shipped:
        return ship(root, self.holds, self.put)


def age(root: Path, when: float = HOUR_AGO) -> None:
    """Date every file an hour back, as a project's files are when it is submitted."""
    for path in root.rglob("*"):
        os.utime(path, (when, when), follow_symlinks=False)


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "cache-home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "model.py").write_text("NAME = 'a'\n")
    (root / "pkg" / "deep" / "run.sh").write_text("#!/bin/sh\n")
    (root / "pkg" / "deep" / "run.sh").chmod(0o755)
    (root / "notes.log").write_text("local\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / "latest").symlink_to("pkg/model.py")
    os.link(root / "train.py", root / "pkg" / "train-again.py")
    age(root)
    return root


def test_an_unchanged_directory_is_not_packed_again_and_has_the_same_digest(project: Path) -> None:
    fleet = Fleet()
    first = fleet.ship(project)
    # When the same directory is shipped again, unchanged
    again = fleet.ship(project)
    # Then the cache gives the digest without packing, the fleet is not sent it again, and the digest is
    # the archive's, packed without any cache
    assert first.packed is not None and first.uploaded
    assert again == Shipped(first.digest, first.files, first.size, None, False)
    assert again.digest == digest_of(pack(project)) and fleet.uploads == [first.digest]
    assert again.files == 6  # .gitignore, latest, train.py, pkg/model.py, its hard link, pkg/deep/run.sh
    assert _contents(fleet.blobs[first.digest])["pkg/train-again.py"] == tarfile.LNKTYPE


@pytest.mark.parametrize(
    "change",
    [
        "content and mtime, same size",
        "a file added",
        "a file removed",
        "a file made executable",
        "an ignored file now shipped",
        "a link pointed elsewhere",
    ],
)
def test_a_changed_directory_is_packed_again(project: Path, change: str) -> None:
    fleet = Fleet()
    first = fleet.ship(project)
    # When the directory changes (and is left alone for a while)
    if change == "content and mtime, same size":
        (project / "pkg" / "model.py").write_text("NAME = 'b'\n")
    elif change == "a file added":
        (project / "pkg" / "new.py").write_text("")
    elif change == "a file removed":
        (project / "pkg" / "model.py").unlink()
    elif change == "a file made executable":
        (project / "train.py").chmod(0o755)
    elif change == "an ignored file now shipped":
        (project / ".gitignore").write_text("*.tmp\n")
    else:
        (project / "latest").unlink()
        (project / "latest").symlink_to("train.py")
    age(project, HOUR_AGO + 60)
    second = fleet.ship(project)
    # Then it is packed again, into what packing without a cache gives, and uploaded
    assert second.packed is not None and second.uploaded
    assert second.digest != first.digest
    assert second.digest == digest_of(pack(project)) == fleet.uploads[-1]
    # and that is what the cache holds now
    assert fleet.ship(project).packed is None


def test_a_file_changed_within_a_second_of_packing_is_not_taken_on_trust(project: Path) -> None:
    fleet = Fleet()
    # Given a file written just now (it could be written again in the same clock tick, same size)
    (project / "train.py").write_text("print('now')\n")
    first = fleet.ship(project)
    # When it is shipped again
    second = fleet.ship(project)
    # Then it is packed again (the cache kept nothing from a pack it could not trust)
    assert second.packed is not None and second.digest == first.digest


def test_a_digest_the_fleet_no_longer_holds_is_packed_and_uploaded(project: Path) -> None:
    first = Fleet().ship(project)
    # When another fleet (or one that dropped the blob) is given the same unchanged directory
    other = Fleet()
    again = other.ship(project)
    # Then it is packed and uploaded there, the same bytes
    assert again.uploaded and again.packed is not None
    assert other.uploads == [first.digest]


def test_the_cache_is_private_and_one_another_user_could_write_is_not_read(
    project: Path, cache_home: Path
) -> None:
    fleet = Fleet()
    fleet.ship(project)
    folder = cache_home / "fleet" / "workdirs"
    (entry,) = folder.iterdir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache_home / "fleet").stat().st_mode) == 0o700
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert str(project) not in entry.name and str(project) not in entry.read_text()
    # When someone else could write the cache's folder
    folder.chmod(0o777)
    # Then what it holds is not read: the directory is packed again
    assert fleet.ship(project).packed is not None


def test_an_unusable_cache_is_skipped(project: Path, cache_home: Path) -> None:
    # Given a cache home that is a file (no cache can be written there)
    cache_home.write_text("not a folder\n")
    fleet = Fleet()
    # Then shipping works, packing each time
    assert fleet.ship(project).packed is not None
    assert fleet.ship(project).packed is not None
    assert cache.get("workdirs", "0" * 32, "x") is None


def test_the_archive_is_what_tarfile_writes(tmp_path: Path) -> None:
    # Given names tarfile writes a PAX record for (long, not ASCII) beside ordinary ones
    root = tmp_path / "names"
    long_dir = root / ("d" * 120)
    long_dir.mkdir(parents=True)
    (long_dir / "f.py").write_text("long\n")
    (root / "café.py").write_text("unicode\n")
    (root / "plain.py").write_text("x" * 1000)
    (root / ("l" * 101)).symlink_to("plain.py")
    os.link(root / "plain.py", root / "same.py")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o750)
    # Then the archive is byte for byte what tarfile's own writer makes of the same members
    names = ["café.py", "l" * 101, "plain.py", "run.sh", "same.py", f"{'d' * 120}/f.py"]
    assert pack(root) == _reference(root, names)


def _reference(root: Path, names: list[str]) -> bytes:
    from fleet.client.workdir import COMPRESS_LEVEL

    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=COMPRESS_LEVEL) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in names:
            info = tar.gettarinfo(str(root / name), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if info.mode & 0o111 else 0o644
            if info.isreg():
                with (root / name).open("rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def _contents(data: bytes) -> dict[str, bytes]:
    """Each member's type, by name."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: m.type for m in tar}
