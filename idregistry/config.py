"""The registry's configuration: the ``[registry]`` section of ``photon.toml`` (declared in photon's core)."""
from photon import RegistryConfig

__all__ = ["RegistryConfig"]
