"""The joiner's configuration is the ``[joiner]`` section of ``photon.toml`` (see photon's config); the
adapter it names is loaded by :func:`load_adapter`."""
from photon import JoinerConfig

from joiner._adapter import load_adapter

__all__ = ["JoinerConfig", "load_adapter"]
