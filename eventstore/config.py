"""The event store's configuration is the ``[eventstore]`` section of ``photon.toml`` (see photon's config)."""
from photon import EventStoreConfig

__all__ = ["EventStoreConfig"]
