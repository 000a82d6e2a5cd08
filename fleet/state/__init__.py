"""The Redis state store: the single source of truth for jobs, nodes and GPU claims."""

from fleet.state.connection import connect
from fleet.state.jobs import JobStore
from fleet.state.nodes import NodeStore
from fleet.state.stores import Stores

__all__ = ["JobStore", "NodeStore", "Stores", "connect"]
