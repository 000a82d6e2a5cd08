"""Where the API is and who you are: ``Client(url, token)``, else ``FLEET_API_URL`` and ``FLEET_TOKEN``,
else the credentials file ``fleet login`` wrote (``~/.config/fleet/credentials.json``, mode 0600).
A user never holds Redis credentials. HTTPS certificates are verified against the system's CAs, or
``ca_file`` / ``FLEET_CA_FILE`` for a fleet's own CA."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from fleet.errors import ConfigError


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str
    ca_file: str | None
    #: the URL's parts (scheme, host, port, path prefix), checked
    parts: SplitResult


def credentials_path() -> Path:
    """Where ``fleet login`` keeps the API's URL and the token: ``$FLEET_CREDENTIALS``, else
    ``$XDG_CONFIG_HOME/fleet/credentials.json`` (``~/.config/...``)."""
    if path := os.environ.get("FLEET_CREDENTIALS"):
        return Path(path)
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "fleet" / "credentials.json"


def save_credentials(url: str, token: str, ca_file: str | None = None) -> Path:
    """Write the credentials file readable by its owner only (0600, created so: never readable
    by others even for a moment)."""
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": url, "token": token, "ca_file": ca_file}, out)
    tmp.replace(path)
    return path


def resolve(url: str | None, token: str | None, ca_file: str | None) -> Credentials:
    """The arguments, else the environment, else the saved file; :class:`ConfigError` for no URL or
    one that is not ``http(s)://HOST[:PORT]``."""
    saved = {} if url and token else _saved()
    url = (url or os.environ.get("FLEET_API_URL") or saved.get("url") or "").rstrip("/")
    token = token or os.environ.get("FLEET_TOKEN") or saved.get("token") or ""
    if not url:
        raise ConfigError(
            "no fleet API: run `fleet login URL`, or set FLEET_API_URL and FLEET_TOKEN "
            "(`fleet up` prints them)"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"fleet API URL {url!r}: {exc}; expected http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"fleet API URL {url!r}: expected http://HOST:PORT or https://HOST:PORT")
    ca_file = ca_file or os.environ.get("FLEET_CA_FILE") or saved.get("ca_file")
    return Credentials(url, token, ca_file, parts)


def _saved() -> dict[str, Any]:
    path = credentials_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable credentials ({exc}); run `fleet login` again") from None
    return data if isinstance(data, dict) else {}
