"""``marl run``: a team answers a free prompt or a cooperative task, transcript printed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from marl.cli.common import fail, load_runtime_team, quiet_transformers

if TYPE_CHECKING:
    from marl.games.tasks import Task
    from marl.orchestrator.team import Team, TeamResult


def _out_folder(team: str, out: str | None) -> Path:
    """``--out``, else ``RUN/transcripts/run-<time>`` for a run, else ``runs/run-<time>``."""
    from marl.infra.layout import resolve

    if out is not None:
        return Path(out)
    stamp = time.strftime("run-%Y%m%d-%H%M%S")
    run = resolve(team).run if Path(team).is_dir() else None
    return run / "transcripts" / stamp if run is not None else Path("runs") / stamp


def _show(result: TeamResult, title: str) -> None:
    typer.secho(title, bold=True)
    for m in result.transcript:
        reads = f" (reads {', '.join(m.reads)})" if m.reads else ""
        typer.secho(f"[{m.node}]{reads}", fg="cyan")
        typer.echo(m.text.strip())
    typer.echo(f"answer ({result.decided_by}): {result.answer.strip()}")


def _tasks(team: Team, game: str, episodes: int, seed: int) -> list:
    """Held-out instances of ``game``, with the team's task arguments when it is its task."""
    from marl.orchestrator.arena.credit import held_out_tasks

    kwargs = team.cfg.game.kwargs if team.cfg.game.name == game else {}
    try:
        return held_out_tasks(game, kwargs, episodes, seed)
    except (TypeError, ValueError) as exc:
        fail(f"{game}: {exc}")


TeamSource = Annotated[
    str,
    typer.Argument(
        help="Team YAML (untrained), run folder, RUN/best, checkpoint or exported team folder."
    ),
]
Prompt = Annotated[str | None, typer.Option("--task", help="A free prompt for the team.")]
TaskName = Annotated[
    str | None, typer.Option("--game", help="A cooperative task (e.g. plan_execute), scored.")
]
MAX_EPISODES = 100_000  # the tasks and their transcripts are held in memory
Episodes = Annotated[int, typer.Option(min=1, max=MAX_EPISODES, help="Tasks to play with --game.")]
Seed = Annotated[
    int, typer.Option(help="First task seed (held-out split); also seeds the team's sampling.")
]
Out = Annotated[
    str | None,
    typer.Option(
        help="Folder for transcripts.jsonl (default RUN/transcripts/run-<time>, else "
        "runs/run-<time>)."
    ),
]


def run_cmd(
    team: TeamSource,
    task: Prompt = None,
    game: TaskName = None,
    episodes: Episodes = 1,
    seed: Seed = 1_000_000_000,
    out: Out = None,
) -> None:
    """Run a team on a prompt (--task) or on cooperative tasks (--game, --episodes): each
    node's message, the answer and, for tasks, the score and the accuracy."""
    if (task is None) == (game is None):
        fail("give exactly one of --task TEXT or --game TASK")
    quiet_transformers()
    from marl.games.tasks import task_names
    from marl.orchestrator.arena.credit import Accuracy
    from marl.orchestrator.team import TeamError

    if game is not None and game not in task_names():  # before any model is loaded
        fail(f"unknown cooperative task {game!r}; known: {', '.join(task_names())}")
    runtime = load_runtime_team(team, seed=seed)
    problems = [task] if task is not None else _tasks(runtime, game, episodes, seed)
    try:
        results = runtime.run_batch(problems)
    except TeamError as exc:
        fail(str(exc))
    folder = _out_folder(team, out)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "transcripts.jsonl").open("w", encoding="utf-8") as f:
        for i, (problem, result) in enumerate(zip(problems, results, strict=True)):
            f.write(json.dumps({**_problem_row(problem), **result.to_dict()}) + "\n")
            title = "task" if isinstance(problem, str) else f"{game} seed {problem.seed}"
            _show(result, f"--- {title} ({i + 1}/{len(problems)})")
            if result.score is not None:
                typer.echo(f"score: {result.score:g} (truth {problem.answer})")
    if game is not None:
        acc = Accuracy.of(results)
        typer.secho(
            f"accuracy {acc.accuracy:.3f} on {acc.n} tasks, 95% CI "
            f"[{acc.ci_low:.3f}, {acc.ci_high:.3f}]; {acc.messages_per_task:.2f} "
            f"messages, {acc.tokens_per_task:.0f} tokens per task",
            bold=True,
        )
    typer.echo(f"transcripts: {folder / 'transcripts.jsonl'}")


def _problem_row(problem: str | Task) -> dict[str, Any]:
    """A transcript row's head: the free prompt, or the task instance with its truth."""
    if isinstance(problem, str):
        return {"task": problem}
    return {
        "game": problem.game,
        "seed": problem.seed,
        "question": problem.question,
        "private_views": dict(problem.private_views),
        "truth": problem.answer,
    }


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
