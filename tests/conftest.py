"""Test-session setup and the fixtures shared by the test packages."""

import os

# Must happen before torch loads libgomp. With the default (active, spinning) OpenMP wait
# policy, torch on a 2-core machine shared with other processes slows down 10-25x.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Callable  # noqa: E402

import pytest  # noqa: E402

from helpers import build_tiny_host  # noqa: E402


@pytest.fixture(scope="session")
def tiny_host() -> Callable:
    """``tiny_host("red", "blue", perturb=True)``: see :func:`build_tiny_host`."""
    return build_tiny_host
