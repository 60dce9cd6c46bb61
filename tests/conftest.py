"""Test-session setup shared by the test packages (their shared builders are in helpers.py)."""

import os

# Must happen before torch loads libgomp. With the default (active, spinning) OpenMP wait
# policy, torch on a 2-core machine shared with other processes slows down 10-25x.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
