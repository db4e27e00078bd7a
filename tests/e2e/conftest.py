import docker
import pytest


@pytest.fixture(scope="session")
def engine():
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        pytest.fail(f"the Docker engine does not answer ({exc}); run `make setup` first")
    return client
