"""Every store of one fleet on one Redis client: how each service gets its stores.

``Stores.open(settings)`` connects once; each store is built on first use and shares the client (and
the Lua scripts registered on it, see ``load_scripts``). A service handed its job store (tests, the
benchmarks) reaches the other stores on the same client with ``Stores.of(settings, jobs)``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from fleet.keys import Keys
from fleet.state.accounting import AccountingStore
from fleet.state.arrays import ArrayStore
from fleet.state.blobs import BlobStore
from fleet.state.connection import connect, connect_binary
from fleet.state.jobs import JobStore
from fleet.state.nodes import NodeStore
from fleet.state.profiles import ProfileStore
from fleet.state.ranked import RankIndex
from fleet.state.retention import RetentionStore
from fleet.state.tenants import TenantStore
from fleet.state.tokens import TokenStore
from fleet.state.uids import JobUids
from fleet.state.webhooks import WebhookStore

if TYPE_CHECKING:
    from fleet.config import Settings


class Stores:
    """The stores of the fleet ``settings`` names, on ``client`` (the state DB, decoded to str)."""

    def __init__(
        self, settings: Settings, client: Any, *, jobs: JobStore | None = None, nodes: NodeStore | None = None
    ) -> None:
        self.settings = settings
        # typed Any: redis-py's annotations cannot express decode_responses=True (str, not bytes)
        self.redis: Any = client
        self.keys = jobs.keys if jobs is not None else Keys(settings.key_prefix)
        self.jobs = jobs or JobStore(client, self.keys)
        self.nodes = nodes or NodeStore(client, self.keys)

    @classmethod
    def open(cls, settings: Settings, *, most: int | None = None) -> Stores:
        """Connect to the fleet's Redis (``most``: at most that many connections, see ``connect``)."""
        return cls(settings, connect(settings, most=most))

    @classmethod
    def of(cls, settings: Settings, jobs: JobStore, nodes: NodeStore | None = None) -> Stores:
        """The stores on the client of ``jobs`` (and ``nodes``): a service built around its job store."""
        return cls(settings, jobs.redis, jobs=jobs, nodes=nodes)

    @functools.cached_property
    def arrays(self) -> ArrayStore:
        return ArrayStore(self.jobs)

    @functools.cached_property
    def ranked(self) -> RankIndex:
        return RankIndex(self.redis, self.keys)

    @functools.cached_property
    def tenants(self) -> TenantStore:
        return TenantStore(self.redis, self.keys)

    @functools.cached_property
    def tokens(self) -> TokenStore:
        return TokenStore(self.redis, self.keys)

    @functools.cached_property
    def webhooks(self) -> WebhookStore:
        return WebhookStore(self.redis, self.keys)

    @functools.cached_property
    def retention(self) -> RetentionStore:
        return RetentionStore(self.redis, self.keys)

    @functools.cached_property
    def accounting(self) -> AccountingStore:
        return AccountingStore(self.redis, self.keys)

    @functools.cached_property
    def uids(self) -> JobUids:
        return JobUids(self.redis, self.keys)

    @functools.cached_property
    def profiles(self) -> ProfileStore:
        return ProfileStore(self.redis, self.keys, self.settings.workdir_retention_s)

    @functools.cached_property
    def blobs(self) -> BlobStore:
        """Directories and files shipped with jobs: bytes, on a client of their own (not decoded)."""
        return BlobStore(connect_binary(self.settings), self.keys, self.settings.workdir_retention_s)

    def close(self) -> None:
        """Close the connections (the blob store's too, if it was opened)."""
        self.redis.close()
        if "blobs" in self.__dict__:
            self.blobs.redis.close()
