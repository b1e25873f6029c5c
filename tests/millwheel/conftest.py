"""MillWheel fixtures: one embedded PostgreSQL server for the session (a real server on a free port of
127.0.0.1, stopped after the last test, also on failure) and a fresh schema in it per test."""
from __future__ import annotations

import uuid

import pytest

from millwheel import EmbeddedPostgres


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    server = EmbeddedPostgres(tmp_path_factory.mktemp("millwheel-pg") / "pg")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server):
    """A store URL on the session's server whose tables live in a schema of their own."""
    return f"{pg_server.url}?schema=t_{uuid.uuid4().hex[:12]}"
