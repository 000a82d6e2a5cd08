"""The operator's registry allow-list: a job's image must come from a registry listed in
``allowed_registries`` (checked at submit, and again by the agent before it pulls)."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.errors import SpecError

#: where an image named without a registry (``pytorch/pytorch``, ``busybox``) comes from
DEFAULT_REGISTRY = "docker.io"


def registry_of(image: str) -> str:
    """The registry an image reference names: its first component when that looks like a host
    (``nvcr.io/...``, ``registry:5000/...``, ``localhost/...``), else Docker Hub's."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first.lower()
    return DEFAULT_REGISTRY


def check_image(image: str, allowed: Sequence[str], field: str = "image") -> None:
    """:class:`SpecError` unless ``image`` comes from a registry in ``allowed`` (``*``: any; a host
    without a port allows it on any port, ``host:port`` that port alone)."""
    if "*" in allowed:
        return
    registry = registry_of(image)
    listed = {a.lower() for a in allowed}
    if registry not in listed and registry.partition(":")[0] not in listed:
        raise SpecError(
            f"{field}: {image!r} comes from registry {registry!r}, which is not one the operator allows "
            f"(allowed_registries: {', '.join(allowed) or 'none'}); use an image from one of them, or ask "
            "an operator to add the registry in fleet.toml"
        )
