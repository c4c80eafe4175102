"""Store URLs for every backend: memory, a SQLite file, and real Redis and PostgreSQL servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from state_servers import PostgresServer, RedisServer, missing_server, postgres_binaries, redis_binary


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    binary = redis_binary()
    if binary is None:
        missing_server("redis-server")
    server = RedisServer(binary)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    binaries = postgres_binaries()
    if binaries is None:
        missing_server("PostgreSQL")
    server = PostgresServer(binaries)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["memory", "sqlite", "postgresql", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param
    if kind == "memory":
        return "memory"
    if kind == "sqlite":
        return f"sqlite://{tmp_path / 'state.db'}"
    if kind == "redis":
        return request.getfixturevalue("redis_server").url
    return request.getfixturevalue("postgres_server").url
