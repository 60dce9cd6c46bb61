"""A task as the team runtime needs it: the shared question and the agents' private views."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from marl.games.tasks import Task
from marl.orchestrator.team.errors import TeamError


@dataclass(frozen=True)
class TaskView:
    """A task as the runtime needs it: the shared question, per-agent private views."""

    question: str
    views: Mapping[str, str]
    task: Task | None = None


def assign_views(views: Mapping[str, str], agents: Sequence[str]) -> dict[str, str]:
    """Private views -> team agents: by name where they match, then in order.

    A task names its own agents (``agent_0``, ``sender``); a team has its own names
    (``solver``, ``critic``).  Matching names win, the other views go to the other agents in
    the team's order.  A view with no agent left would silently lose information: error.
    """
    out = {a: views[a] for a in agents if a in views}
    rest = [v for k, v in views.items() if k not in out]
    free = [a for a in agents if a not in out]
    if len(rest) > len(free):
        raise TeamError(
            f"the task has {len(views)} private views ({', '.join(views)}) but the "
            f"team runs only {len(agents)} agents ({', '.join(agents)}); use a "
            "task with fewer agents or a bigger team"
        )
    out.update(zip(free, rest, strict=False))
    return out


def as_task_view(task: str | Task | TaskView) -> TaskView:
    if isinstance(task, TaskView):
        return task
    if isinstance(task, str):
        return TaskView(task, {})
    if isinstance(task, Task):
        return TaskView(task.question, dict(task.private_views), task)
    raise TypeError(f"a task is a str or a games.tasks.Task, got {type(task).__name__}")
