"""Kept outputs: the paths users send, the agent's copy of a hostile working directory, the API's tar
and the client's unpacking of whatever archive it receives."""

from __future__ import annotations

import grp
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from fleet.agent import checkpoints
from fleet.agent.outputs import keep
from fleet.client import endpoints as api
from fleet.client.download import Exists, unpack
from fleet.errors import SpecError
from fleet.models import JobSpec, relative_path
from fleet.outputs import FILES, kept_dir, open_dir, read_kept, storage_gid, tar_tree, tenant_dir, usage

FIX = "give a relative path"


# -- paths users send ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "clean"), [("outputs", "outputs"), ("./runs//out/", "runs/out"), ("a/./b", "a/b"), (".", "")]
)
def test_a_relative_path_is_cleaned(given: str, clean: str) -> None:
    assert relative_path(given, FIX) == clean


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("/etc", "'/etc' is an absolute path; give a relative path"),
        ("../x", "'../x' leads out of the directory ('..'); give a relative path"),
        ("a/../../b", "'a/../../b' leads out of the directory"),
        ("a/..", "'a/..' leads out of the directory"),
        ("x\x00y", "give a relative path (at most 1024 characters, no NUL)"),
        ("a" * 1025, "give a relative path (at most 1024 characters, no NUL)"),
    ],
)
def test_a_path_out_of_the_directory_is_refused(given: str, said: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        relative_path(given, FIX)
    assert said in str(caught.value)


@pytest.mark.parametrize("bad", ["/abs", "../up", "a/../..", ".", ""])
def test_the_spec_names_the_outputs_field_and_the_fix(bad: str) -> None:
    with pytest.raises(SpecError) as caught:
        JobSpec.parse({"name": "j", "command": ["true"], "outputs": bad})
    assert "outputs: " in str(caught.value) and "e.g. 'outputs' or 'runs/out'" in str(caught.value)
    assert JobSpec.parse({"name": "j", "command": ["true"]}).outputs == "outputs"


def test_the_client_refuses_bad_paths_and_names_before_sending() -> None:
    assert api.download("j1", "a//b/", None) == ("/v1/jobs/j1/outputs", {"path": "a/b"})
    assert api.download("j1", None, "latest") == ("/v1/jobs/j1/checkpoint", {"name": "latest"})
    for path, checkpoint in (("../x", None), ("/etc", None), (None, "../x"), (None, ".."), ("a", "latest")):
        with pytest.raises(SpecError):
            api.download("j1", path, checkpoint)


# -- the agent's copy ------------------------------------------------------------------------


def storage(tmp_path: Path) -> Path:
    """The checkpoint storage: there already (the agent never makes checkpoint_root for outputs)."""
    (tmp_path / "ckpt").mkdir()
    return tmp_path / "ckpt"


def job_tree(work: Path) -> Path:
    out = work / "outputs"
    (out / "sub").mkdir(parents=True)
    (out / "result.txt").write_text("result\n")
    (out / "sub" / "deep.txt").write_text("deep\n")
    return out


def test_the_outputs_are_kept_and_the_latest_attempt_wins(tmp_path: Path) -> None:
    root, work = storage(tmp_path), tmp_path / "work"
    job_tree(work)
    first = keep(work, "outputs", root, "team", "j1", 1, 1 << 20)
    assert first.kept is not None and (first.kept.bytes, first.kept.files, first.note) == (12, 3, "")
    (work / "outputs" / "result.txt").write_text("second attempt\n")
    (work / "outputs" / "sub" / "deep.txt").unlink()
    second = keep(work, "outputs", root, "team", "j1", 2, 1 << 20)
    folder = kept_dir(root, "team", "j1")
    assert second.kept is not None and read_kept(folder) == second.kept
    assert (folder / FILES / "result.txt").read_text() == "second attempt\n"
    assert not (folder / FILES / "sub" / "deep.txt").exists()
    assert usage(root, "team") == len("second attempt\n") and usage(root, "team", but="j1") == 0
    assert oct((root / ".fleet-outputs").stat().st_mode & 0o777) == "0o700"
    # an attempt that left no outputs directory keeps the earlier attempt's
    assert keep(tmp_path / "empty", "outputs", root, "team", "j1", 3, 1 << 20).kept is None
    assert read_kept(folder) == second.kept


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to a group")
@pytest.mark.parametrize(("group", "shared"), [("daemon", True), ("", False), ("no-such-group", False)])
def test_what_is_kept_and_checkpoints_are_the_storage_groups_to_read_and_no_one_elses(
    tmp_path: Path, group: str, shared: bool
) -> None:
    # Given a storage group (the API's: "daemon" here, a group every Debian system has), or none
    gid = grp.getgrnam("daemon").gr_gid if shared else 0
    root, work = storage(tmp_path), tmp_path / "work"
    job_tree(work)
    (root / ".fleet-outputs").mkdir(mode=0o700)  # kept before there was a group: given to it now
    # When outputs are kept and a checkpoint directory is made
    assert keep(work, "outputs", root, "team", "j1", 1, 1 << 20, group).kept is not None
    ckpt = checkpoints.prepare(root, "j1", 1, 4321, 4321, storage_gid(group))
    # Then everything kept is root's and the group's to read, or root's alone: never anyone else's
    folder = kept_dir(root, "team", "j1")
    kept = [root / ".fleet-outputs", folder.parent, folder, *folder.rglob("*")]
    assert len(kept) == 8  # .fleet-outputs, team, j1, kept.json, files, result.txt, sub, deep.txt
    for path in kept:
        info = path.stat()
        mode = (0o750 if path.is_dir() else 0o640) if shared else (0o700 if path.is_dir() else 0o600)
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, gid, mode), path
    # and the job's checkpoint directory is the job's, the group's to read, its new files the group's
    info = ckpt.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (
        (4321, gid, 0o2750) if shared else (4321, 4321, 0o700)
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another user")
def test_links_devices_and_files_not_the_jobs_own_are_left_out(tmp_path: Path) -> None:
    # Given a working directory of uid 4321 whose outputs hold a link to a root-only file, a link out,
    # a FIFO, a hard link to root's file and a file of its own
    root, work = storage(tmp_path), tmp_path / "work"
    out = work / "outputs"
    out.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("TOPSECRET")
    secret.chmod(0o600)
    (out / "leak").symlink_to(secret)
    (out / "up").symlink_to("/")
    os.mkfifo(out / "fifo")
    os.link(secret, out / "hard")
    (out / "mine.txt").write_text("mine")
    for path in (work, out, out / "mine.txt", out / "fifo"):
        os.chown(path, 4321, 4321)
    # When they are kept
    outcome = keep(work, "outputs", root, "team", "j1", 1, 1 << 20)
    # Then only its own file is, and the job is told what was left out
    files = kept_dir(root, "team", "j1") / FILES
    assert sorted(os.listdir(files)) == ["mine.txt"]
    assert outcome.note == "4 links, devices or files not the job's own left out"


def test_an_outputs_directory_that_is_a_link_keeps_nothing(tmp_path: Path) -> None:
    root, work = storage(tmp_path), tmp_path / "work"
    job_tree(tmp_path / "elsewhere")
    work.mkdir()
    (work / "outputs").symlink_to(tmp_path / "elsewhere" / "outputs")
    assert keep(work, "outputs", root, "team", "j1", 1, 1 << 20).kept is None
    assert not kept_dir(root, "team", "j1").exists()


def test_over_the_quota_nothing_more_is_kept_and_the_earlier_copy_stays(tmp_path: Path) -> None:
    root, work = storage(tmp_path), tmp_path / "work"
    job_tree(work)
    assert keep(work, "outputs", root, "team", "j1", 1, 100).kept is not None  # 12 bytes
    (work / "outputs" / "big").write_bytes(b"x" * 200)
    over = keep(work, "outputs", root, "team", "j1", 2, 100)
    assert over.kept is None
    assert over.note == (
        "outputs of attempt 2 not kept (outputs/): tenant team's kept outputs may hold 100 B and its "
        "other jobs' hold 0 B"
    )
    kept = read_kept(kept_dir(root, "team", "j1"))
    assert kept is not None and kept.attempt == 1
    assert [p.name for p in tenant_dir(root, "team").iterdir()] == ["j1"]  # no temp left
    # another job of the tenant counts against the same quota
    assert keep(work, "outputs", root, "team", "j2", 1, 100).note.endswith("its other jobs' hold 12 B")


# -- the API's tar and the client's unpacking ----------------------------------------------------


def test_what_is_kept_travels_as_a_tar_without_links(tmp_path: Path) -> None:
    root, work = storage(tmp_path), tmp_path / "work"
    job_tree(work)
    keep(work, "outputs", root, "team", "j1", 1, 1 << 20)
    files = kept_dir(root, "team", "j1") / FILES
    (files / "planted").symlink_to("/etc/passwd")  # not the agent's, but never followed either
    data = b"".join(tar_tree(open_dir(files), ""))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert sorted((m.name, m.type) for m in tar) == [
            ("result.txt", tarfile.REGTYPE),
            ("sub", tarfile.DIRTYPE),
            ("sub/deep.txt", tarfile.REGTYPE),
        ]
    written = unpack(io.BytesIO(data), tmp_path / "got")
    assert (
        written == ["result.txt", "sub/deep.txt"]
        and (tmp_path / "got" / "result.txt").read_text() == "result\n"
    )


def archive(*members: tuple[str, bytes, str]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            data = b"data" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize(
    "bad",
    [
        ("../escape", tarfile.REGTYPE, ""),
        ("/abs", tarfile.REGTYPE, ""),
        ("a/../../escape", tarfile.REGTYPE, ""),
        ("link", tarfile.SYMTYPE, "/etc/passwd"),
        ("hard", tarfile.LNKTYPE, "/etc/passwd"),
        ("dev", tarfile.CHRTYPE, ""),
        ("fifo", tarfile.FIFOTYPE, ""),
    ],
)
def test_the_client_refuses_a_crafted_archive_and_writes_nothing(
    tmp_path: Path, bad: tuple[str, bytes, str]
) -> None:
    dest = tmp_path / "dest"
    with pytest.raises(SpecError, match="refused"):
        unpack(archive(("ok.txt", tarfile.REGTYPE, ""), bad), dest)
    assert os.listdir(dest) == []
    assert sorted(os.listdir(tmp_path)) == ["dest"]


def test_the_client_never_writes_through_a_link_and_overwrites_only_with_force(tmp_path: Path) -> None:
    dest, victim = tmp_path / "dest", tmp_path / "victim"
    dest.mkdir()
    victim.mkdir()
    (victim / "f").write_text("theirs")
    (dest / "sub").symlink_to(victim)  # a folder of the archive lands under a link: refused
    with pytest.raises(SpecError, match="is a link or a file, not a folder"):
        unpack(archive(("sub/f", tarfile.REGTYPE, "")), dest)
    assert (victim / "f").read_text() == "theirs"
    (dest / "f").symlink_to(victim / "f")  # a file of the archive where a link is
    with pytest.raises(Exists, match="f exists: give --force"):
        unpack(archive(("f", tarfile.REGTYPE, "")), dest)
    unpack(archive(("f", tarfile.REGTYPE, "")), dest, force=True)
    assert (victim / "f").read_text() == "theirs" and not (dest / "f").is_symlink()
    assert (dest / "f").read_text() == "data"
    assert sorted(os.listdir(dest)) == ["f", "sub"]  # no temporary directory left


class Expired:
    """The retention store's answer: these jobs were deleted by retention."""

    def __init__(self, *ids: str) -> None:
        self.ids = set(ids)

    def expired(self, job_ids: list[str]) -> list[str]:
        return [j for j in job_ids if j in self.ids]


def test_the_sweep_removes_kept_outputs_with_their_job(tmp_path: Path) -> None:
    import logging

    from fleet.agent.sweep import sweep

    root, work = storage(tmp_path), tmp_path / "work"
    job_tree(work)
    for job_id in ("gone", "kept"):
        (root / job_id).mkdir()
        keep(work, "outputs", root, "team", job_id, 1, 1 << 20)
    assert sweep(root, Expired("gone"), logging.getLogger("test")) == ["gone"]  # type: ignore[arg-type]
    assert sorted(os.listdir(tenant_dir(root, "team"))) == ["kept"]
    assert sorted(os.listdir(root)) == [".fleet-outputs", "kept"]
