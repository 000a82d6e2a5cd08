"""Unpacking a shipped directory is safe on every Python fleet claims (3.11.2 has no tarfile ``data``
filter): crafted archives are refused or neutralised, and nothing lands outside the directory."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.client.workdir import pack
from fleet.errors import SpecError
from fleet.workdir import clean_temp, digest_of, unpack

Member = tuple[tarfile.TarInfo, bytes | None]


def member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "", mode: int = 0o644
) -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


def archive(*members: Member) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def everything_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def place(tmp_path: Path) -> Callable[[bytes], Path]:
    """Unpack into tmp_path/node/workdirs; what else is in tmp_path is checked to stay as it was."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim").write_text("keep\n")

    def unpack_here(data: bytes) -> Path:
        return unpack(data, digest_of(data), tmp_path / "node" / "workdirs")

    return unpack_here


ESCAPES = {
    "an absolute path": ([member("/tmp/fleet-escaped", data=b"x")], "absolute path"),
    "a '..' component": (
        [member("pkg/../../outside/new", data=b"x")],
        r"leads out of the directory \('..'\)",
    ),
    "a symlink to /etc": ([member("etc", tarfile.SYMTYPE, link="/etc")], "link to an absolute path"),
    "a symlink out, then a file through it": (
        [member("up", tarfile.SYMTYPE, link="../../../outside"), member("up/victim", data=b"owned")],
        "link out of the directory",
    ),
    "a file written through an in-tree link": (
        [member("d", tarfile.DIRTYPE), member("l", tarfile.SYMTYPE, link="d"), member("l/x", data=b"x")],
        r"under a link \('l'\)",
    ),
    "links that chain out only once both exist": (
        [
            member("sub", tarfile.DIRTYPE),
            member("sub/b", tarfile.SYMTYPE, link="a/../.."),
            member("sub/a", tarfile.SYMTYPE, link=".."),
        ],
        "leads out of the directory through another link",
    ),
    "a hard link out": ([member("h", tarfile.LNKTYPE, link="../../outside/victim")], "leads out"),
    "a hard link to an absolute path": ([member("h", tarfile.LNKTYPE, link="/etc/passwd")], "absolute path"),
    "a hard link to a link": (
        [member("l", tarfile.SYMTYPE, link="x"), member("h", tarfile.LNKTYPE, link="l")],
        "not a file unpacked before it",
    ),
    "a character device": ([member("null", tarfile.CHRTYPE)], "device, FIFO or socket"),
    "a block device": ([member("sda", tarfile.BLKTYPE)], "device, FIFO or socket"),
    "a FIFO": ([member("pipe", tarfile.FIFOTYPE)], "device, FIFO or socket"),
    "a link replaced by a file of the same name": (
        [member("x", tarfile.SYMTYPE, link="y"), member("x", data=b"through the link")],
        "given twice",
    ),
}


@pytest.mark.parametrize("case", list(ESCAPES))
def test_a_crafted_archive_is_refused_and_nothing_is_written_outside(
    case: str, tmp_path: Path, place: Callable[[bytes], Path]
) -> None:
    members, message = ESCAPES[case]
    before = everything_under(tmp_path)
    with pytest.raises(SpecError, match=f"cannot be unpacked safely: .*{message}"):
        place(archive(*members))
    # nothing outside, nothing left behind (no half tree, no temporary directory)
    assert (tmp_path / "outside" / "victim").read_text() == "keep\n"
    assert not Path("/tmp/fleet-escaped").exists()
    assert everything_under(tmp_path) - before <= {"node", "node/workdirs"}
    assert list((tmp_path / "node" / "workdirs").iterdir()) == []


def test_set_id_sticky_and_group_write_bits_are_dropped(place: Callable[[bytes], Path]) -> None:
    unpacked = place(
        archive(
            member("bin", tarfile.DIRTYPE, mode=0o7777),
            member("bin/tool", data=b"#!/bin/sh\n", mode=0o6777),
            member("notes", data=b"n", mode=0o4666),
        )
    )
    modes = {name: stat.S_IMODE((unpacked / name).stat().st_mode) for name in ("bin", "bin/tool", "notes")}
    assert modes == {"bin": 0o755, "bin/tool": 0o755, "notes": 0o644}
    assert stat.S_IMODE(unpacked.stat().st_mode) == 0o755


def test_links_inside_the_tree_and_hard_links_unpack(place: Callable[[bytes], Path]) -> None:
    unpacked = place(
        archive(
            member("./", tarfile.DIRTYPE),
            member("pkg/model.py", data=b"NAME = 1\n"),
            member("latest", tarfile.SYMTYPE, link="pkg/model.py"),
            member("pkg/up", tarfile.SYMTYPE, link="../pkg"),
            member("copy.py", tarfile.LNKTYPE, link="pkg/model.py"),
        )
    )
    assert (unpacked / "latest").read_text() == "NAME = 1\n" and os.readlink(
        unpacked / "latest"
    ) == "pkg/model.py"
    assert (unpacked / "pkg" / "up" / "model.py").read_text() == "NAME = 1\n"
    assert (unpacked / "copy.py").stat().st_ino == (unpacked / "pkg" / "model.py").stat().st_ino


def test_more_content_than_a_workdir_may_hold_is_refused(tmp_path: Path) -> None:
    data = archive(member("a", data=b"\0" * 4096), member("b", data=b"\0" * 4096))
    with pytest.raises(SpecError, match="more content than"):
        unpack(data, digest_of(data), tmp_path / "workdirs", max_bytes=6000)
    assert list((tmp_path / "workdirs").iterdir()) == []


def test_a_failed_unpack_leaves_nothing_that_stops_the_next(tmp_path: Path) -> None:
    good = archive(member("train.py", data=b"print(1)\n"))
    hexdigest = digest_of(good).split(":")[1]
    into = tmp_path / "workdirs"
    # Given the temporary directory of an unpack cut short, under the name this process would once
    # have chosen itself, and a failed unpack of the same digest
    stale = into / f".{hexdigest}.{os.getpid()}.tmp"
    (stale / "half").mkdir(parents=True)
    bad = archive(member("train.py", data=b"x"), member("train.py", data=b"x"))
    with pytest.raises(SpecError, match="given twice"):
        unpack(bad, digest_of(bad), into)
    # Then the next unpack succeeds all the same
    assert unpack(good, digest_of(good), into).joinpath("train.py").read_text() == "print(1)\n"
    assert sorted(p.name for p in into.iterdir()) == sorted([stale.name, hexdigest])
    # And the cleanup an agent runs at start removes the stale one only
    assert clean_temp(into) == [stale.name] and [p.name for p in into.iterdir()] == [hexdigest]
    assert clean_temp(tmp_path / "none") == []


def test_a_project_with_links_inside_it_round_trips(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    (project / "configs" / "base.yaml").write_text("lr: 1\n")
    (project / "current.yaml").symlink_to("configs/base.yaml")
    (project / "conf").symlink_to("configs")  # a link to a directory is shipped as a link
    data = pack(project)
    unpacked = unpack(data, digest_of(data), tmp_path / "workdirs")
    assert (unpacked / "current.yaml").read_text() == "lr: 1\n"
    assert (unpacked / "conf").is_symlink() and (unpacked / "conf" / "base.yaml").read_text() == "lr: 1\n"


@pytest.mark.parametrize(
    ("target", "why"),
    [("/datasets/x", "a link to an absolute path"), ("../../elsewhere", "a link out of the directory")],
)
def test_a_link_that_leaves_the_project_is_refused_at_pack_naming_it_and_the_fix(
    tmp_path: Path, target: str, why: str
) -> None:
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "train.py").write_text("print(1)\n")
    (project / "sub" / "data").symlink_to(target)
    with pytest.raises(SpecError) as refused:
        pack(project)
    assert f"'sub/data' is {why}" in str(refused.value)
    assert "a line 'sub/data' in" in str(refused.value) and ".fleetignore" in str(refused.value)
    assert "mount" in str(refused.value)
    # And once the link is left out, the project packs
    (project / ".fleetignore").write_text("sub/data\n")
    assert unpack(pack(project), digest_of(pack(project)), tmp_path / "w").joinpath("train.py").is_file()


def test_a_link_leading_out_through_an_ignored_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "datasets" / "x").mkdir(parents=True)
    project = tmp_path / "project"
    project.mkdir()
    (project / "ext").symlink_to(tmp_path / "datasets")
    (project / "data").symlink_to("ext/x")
    (project / ".fleetignore").write_text("ext\n")
    with pytest.raises(
        SpecError, match="'data' is a link that leads out of the directory through another link"
    ):
        pack(project)
