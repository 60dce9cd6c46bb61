"""Test-session setup shared by the test packages (their shared builders are in helpers.py)."""

import os

# Must happen before torch loads libgomp. With the default (active, spinning) OpenMP wait
# policy, torch on a 2-core machine shared with other processes slows down 10-25x.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Also before torch loads MKL: results that do not depend on where tensors sit in memory.
# Without it two identical tiny runs differed in the last digits of a gradient norm of ~1e-13
# (test_async's bit-for-bit test failed 2 of 12 runs; with it 0 of 10 on the same machine).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
