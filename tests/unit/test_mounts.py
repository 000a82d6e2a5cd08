"""The operator's mount allow-list, and what the runtime is handed: the resolved source."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import SpecError
from fleet.models import Mount
from fleet.mounts import check_mounts


def test_the_runtime_is_handed_the_checked_path_not_the_link(tmp_path: Path) -> None:
    # Given an allowed tree holding a link to a directory in it, and a secret outside it
    allowed, secret = tmp_path / "datasets", tmp_path / "secret"
    (allowed / "imagenet").mkdir(parents=True)
    secret.mkdir()
    (allowed / "current").symlink_to(allowed / "imagenet")
    # When a job mounts the link
    (mount,) = check_mounts([Mount(source=str(allowed / "current"), target="/data")], [allowed])
    # Then what the runtime binds is the directory the link named when it was checked: swapping the
    # link afterwards (while an image is pulled) cannot point the bind elsewhere
    (allowed / "current").unlink()
    (allowed / "current").symlink_to(secret)
    assert mount.source == str(allowed / "imagenet") and mount.target == "/data"


def test_a_link_out_of_the_allowed_tree_is_refused(tmp_path: Path) -> None:
    allowed = tmp_path / "datasets"
    allowed.mkdir()
    (allowed / "escape").symlink_to("/etc")
    with pytest.raises(SpecError, match=r"mounts.0.source: .* is outside the operator's allowed_mounts"):
        check_mounts([Mount(source=str(allowed / "escape"), target="/data")], [allowed])
