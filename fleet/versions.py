"""Which release each service runs, and a fleet whose services run different ones.

Each service records its own: an agent in its node record with every heartbeat (``version``, and
``version_at``: the heartbeat it came with, so that a version a newer agent left on a node that an
older one now heartbeats is not believed), the leading controller beside its lease
(``<p>:leader:version``, expiring with it), the API in every answer (the ``Fleet-Version`` header)
and in ``GET /v1/version``. Records of 0.1.0, which recorded none, read as ``""``: shown as
``0.1.0 or older``.

A fleet is upgraded one service at a time (README, "Upgrading"), so for a while it runs two
releases: :func:`mixed` says so, naming the services on each. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from fleet import __version__

#: this process's release
VERSION = __version__
#: the header every API answer carries, naming the API's release
HEADER = "Fleet-Version"
#: how a service that recorded no version (0.1.0, the release before versions were recorded) shows
OLDEST = "0.1.0 or older"
#: services named per version in a note; past that, how many more
NAMED = 5
#: the API and the leading controller in a note (no node's name holds a space)
API, CONTROLLER = "the API", "the controller"


def shown(version: str | None) -> str:
    """``version``, or ``0.1.0 or older`` for a service that recorded none."""
    return version or OLDEST


def _order(version: str) -> tuple[int, ...]:
    """Newest first: by the numbers in it (``0.10.0`` after ``0.9.1``); a missing one is oldest."""
    return tuple(int(n) for n in re.findall(r"\d+", version)) if version else (-1,)


def mixed(services: Mapping[str, str]) -> str:
    """``""`` when every service (name -> its version, ``""`` when it recorded none) runs one release;
    else ``mixed versions: 0.2.0 (the API, the controller, gpu-01); 0.1.0 or older (gpu-02)``: newest
    first, each version's services in the order given."""
    groups: dict[str, list[str]] = {}
    for name, version in services.items():
        groups.setdefault(version, []).append(name)
    if len(groups) < 2:
        return ""
    parts = []
    for version in sorted(groups, key=_order, reverse=True):
        names = groups[version]
        more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
        parts.append(f"{shown(version)} ({', '.join(names[:NAMED])}{more})")
    return "mixed versions: " + "; ".join(parts)
