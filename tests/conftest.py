"""Fixtures shared by the engine and end-to-end tests."""

import docker
import pytest


@pytest.fixture(scope="session")
def engine():
    """The Docker engine; these tests need it and fail (not skip) without it."""
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.fail(f"the Docker engine does not answer ({exc}); run `make setup` first")
    return client
