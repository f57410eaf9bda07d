# Shared fixtures of the Python test suite. ctest passes the build's paths in
# the environment (python/tests/CMakeLists.txt): BACKPLANE_CONFIG (the build
# tree's backends.json), BACKPLANE_TEST_PLUGIN_DIR, BACKPLANE_TEST_CLI,
# BACKPLANE_TEST_DATA, BACKPLANE_TEST_SOURCE_DIR.
import json
import os
import random
import socket

import pytest

import backplane as bp


def _env(name):
    value = os.environ.get(name)
    if not value:
        pytest.skip(f"{name} is not set (run the tests through ctest)")
    return value


@pytest.fixture(scope="session")
def registry():
    return bp.default_registry()


@pytest.fixture(scope="session")
def cpu(registry):
    return registry.backend("cpu").device(0)


@pytest.fixture(scope="session")
def plugin_dir():
    return _env("BACKPLANE_TEST_PLUGIN_DIR")


@pytest.fixture(scope="session")
def cli():
    return _env("BACKPLANE_TEST_CLI")


@pytest.fixture(scope="session")
def source_dir():
    return _env("BACKPLANE_TEST_SOURCE_DIR")


@pytest.fixture(scope="session")
def data_file():
    return _env("BACKPLANE_TEST_DATA")


@pytest.fixture(scope="session")
def nocoll_registry(plugin_dir):
    """The cpu plugin twice: without 'collective' (fallback error) and without it with the
    'local' fallback."""
    config = {
        "schema_version": 1,
        "plugin_dirs": [plugin_dir],
        "default_backend": "plain",
        "backends": [
            {"name": "plain", "library": "backplane_cpu", "required": True,
             "options": {"threads": 1, "collective": False}, "collective_fallback": "error"},
            {"name": "lenient", "library": "backplane_cpu", "required": True,
             "options": {"threads": 1, "collective": False}, "collective_fallback": "local"},
        ],
    }
    return bp.Registry.from_json(json.dumps(config), plugin_dir)


def free_port():
    """A TCP port for a test's server that parallel tests will not take first.

    Binding to port 0 answers from the ephemeral range, where every other
    test's outgoing connections draw their local ports: between releasing it
    and the server's bind, a connect elsewhere can take it (EADDRINUSE). This
    draws at random below that range (Linux's default is 32768-60999) and
    checks that nothing is bound to the port on any address.
    """
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port in 20000-32767 after 1000 tries")
