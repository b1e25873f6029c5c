"""Front doors that import on first use (PEP 562): a package lists where each exported name lives, and a
process imports only the modules of the names it takes (a registry replica no output contract, the
launcher no gRPC)."""
from __future__ import annotations

import importlib


def lazy_exports(package: str, where: dict[str, str], namespace: dict):
    """``(__getattr__, __dir__)`` for ``package``: name ``n`` is imported from ``<package>.<where[n]>`` when
    first asked for and kept in ``namespace`` (the package's globals), so it is looked up once."""

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
