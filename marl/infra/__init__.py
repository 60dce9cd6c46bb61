"""Run infrastructure shared by training and tournaments; imports nothing of the project.

- :mod:`marl.infra.seeds`: ``derive_seed`` (stable seeds from parts) and ``reseed`` (one seed per
  policy of a batch of games);
- :mod:`marl.infra.actors`: ``start_ray`` (an unreachable address fails at once) and ``ActorPool``
  (chunks of work on Ray actors, a dead actor replaced and its chunk replayed, a bounded number
  of times);
- :mod:`marl.infra.placement`: ``reserve`` (a Ray placement group of N bundles, packed or
  spread over the nodes, or a one-line ``PlacementError``) and ``in_bundle``;
- :mod:`marl.infra.atomic`: ``atomic_write`` (a folder or file written to a temp sibling, fsynced
  and renamed into place) and ``sweep_temps`` (the temps a killed writer left);
- :mod:`marl.infra.jsonl`: ``complete_lines`` (a JSON-lines log read back, a torn last line cut);
- :mod:`marl.infra.layout`: the run folder layout (``RUN/latest``, ``RUN/best``,
  ``RUN/checkpoints/step_NNNNNN``, ...), its pointers (followed only inside their run) and how
  a user's path resolves;
- :mod:`marl.infra.budget`: the process's wall-clock budget (``train.max_minutes``), which actor
  pools hand their actors, and ``ReportedError``, an error whose message is the whole report;
- :mod:`marl.infra.seats`: ``ParticipantId`` (``team:<i>``, ``bot:<name>``, ``ckpt:<folder>``,
  ``snap:<id>``), the written name of a seat's occupant that checkpoints store.
"""

from marl.infra.actors import ActorPool, ActorPoolError, RayStartError, start_ray
from marl.infra.atomic import atomic_write
from marl.infra.layout import checkpoint_dir, checkpoint_folder, latest_checkpoint, point, resolve
from marl.infra.seeds import derive_seed, reseed

__all__ = [
    "ActorPool",
    "ActorPoolError",
    "RayStartError",
    "atomic_write",
    "checkpoint_dir",
    "checkpoint_folder",
    "derive_seed",
    "latest_checkpoint",
    "point",
    "reseed",
    "resolve",
    "start_ray",
]
