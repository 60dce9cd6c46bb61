"""Ray placement groups: the resources of a set of actors reserved together, before any of
them starts, and the way they lie over the cluster's nodes.

``pack`` puts the bundles on as few nodes as hold them (a learner's ranks next to each other,
rollout workers sharing a node's cores); ``spread`` puts them on as many nodes as it can (one
node lost costs a share of the workers, not all).  Both are Ray's best-effort strategies: a
cluster too small to honour one still gets the bundles placed where they fit.  A cluster that
cannot hold the bundles at all is refused in one line after ``PLACEMENT_TIMEOUT_S``, never
waited on forever.  When a node dies, Ray reschedules its bundles on the nodes left (where they
fit); an actor started in "any bundle" of the group then lands on the rescheduled bundle.

Ray is imported when first needed, so importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any

from marl.infra.actors import RayStartError

PLACEMENT_TIMEOUT_S = 120.0


class PlacementError(RayStartError):
    """The cluster cannot hold a placement group; the message names the setting that asked
    for it and what is free (the command line prints it in one line, as any Ray start error)."""


def reserve(
    bundle: dict[str, float],
    count: int,
    strategy: str,
    what: str,
    timeout_s: float = PLACEMENT_TIMEOUT_S,
) -> Any:
    """A ready placement group of ``count`` copies of ``bundle`` (resource -> amount; zero
    amounts dropped), placed by ``strategy`` (``pack`` or ``spread``).  ``what`` opens the
    refusal: the setting and count asked for, e.g. ``"train.learner.ranks: 2 ranks"``."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {k: v for k, v in bundle.items() if v > 0}
    pg = placement_group([bundle] * count, strategy=strategy.upper())
    if not pg.wait(timeout_seconds=timeout_s):
        remove_placement_group(pg)
        raise PlacementError(
            f"{what} of {bundle} each ({strategy}) do not fit the Ray cluster "
            f"({ray.available_resources()} free)"
        )
    return pg


def in_bundle(pg: Any, index: int = -1) -> Any:
    """The scheduling strategy that starts an actor in bundle ``index`` of ``pg`` (-1: any
    bundle with room, such as the one a dead actor left)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)


def release(pg: Any) -> None:
    """Give the group's resources back to the cluster."""
    from ray.util.placement_group import remove_placement_group

    remove_placement_group(pg)
