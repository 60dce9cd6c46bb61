"""Stable seeds: the same parts give the same seed in every process, on every machine.

Python's ``hash()`` is salted per process, so seeds are a digest of the parts' ``repr``; a run
(or a tournament) derives every seed it uses from its own seed plus where the seed is used.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (ints, strings and tuples of them)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


def reseed(policies: Iterable[object], seed: int) -> None:
    """Give policy ``k`` the seed ``derive_seed(seed, k)`` (policies without ``reseed`` are
    deterministic and skipped), so a batch of games samples the same wherever it is played."""
    for k, policy in enumerate(policies):
        reseed_policy = getattr(policy, "reseed", None)
        if reseed_policy is not None:
            reseed_policy(derive_seed(seed, k))
