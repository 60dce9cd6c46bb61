"""``marl train``, ``marl plot``, ``marl eval exploitability``, ``marl eval against``,
``marl eval population`` and ``marl eval team``: learning and measuring it."""

from __future__ import annotations

from typing import Annotated

import typer

from marl.cli.common import fail, load_team, quiet_transformers
from marl.cli.errors import writing

eval_app = typer.Typer(no_args_is_help=True, help="Evaluation of players and teams.")


def train_cmd(
    config: Annotated[str, typer.Argument(help="Team YAML file with a `train` section.")],
    out: Annotated[str, typer.Option("--out", help="Run folder.")] = "runs/latest",
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the last checkpoint in --out.")
    ] = False,
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster address (default: the config's, else a local Ray)."),
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Override train.steps.")] = None,
    max_minutes: Annotated[
        float | None, typer.Option(help="Override train.max_minutes (wall-clock budget).")
    ] = None,
) -> None:
    """Train the team's adapters with multi-agent GRPO; metrics in OUT/metrics.jsonl."""
    quiet_transformers()
    from pathlib import Path

    from rich.console import Console

    from marl.agents.models import ModelError
    from marl.infra.actors import RayStartError
    from marl.infra.layout import LayoutError, checkpoint_dir
    from marl.train.progress import TrainProgress
    from marl.train.trainer import Trainer, TrainingError

    cfg = load_team(config)
    if cfg.train is None:
        fail(f"{config}: no `train` section (see docs/schema.json)")
    cfg = cfg.replace(
        train=cfg.train.with_overrides(steps=steps, max_minutes=max_minutes, address=address)
    )
    if not resume and (Path(out) / "latest").is_file():
        fail(f"{out} already holds a run: add --resume to continue it, or choose another --out")
    console = Console()
    try:
        with writing(out), console.status("Starting the trainer (models, workers)..."):
            trainer = Trainer(cfg, Path(out), resume=resume)
        if resume:
            console.print(
                f"resumed from step {trainer.step} ({checkpoint_dir(Path(out), trainer.step)})"
                if trainer.step
                else f"nothing to resume in {out}: starting at step 0",
                markup=False,
            )
        with (
            writing(out),
            TrainProgress(
                console, cfg.train.steps, start=trainer.step, max_minutes=cfg.train.max_minutes
            ) as bar,
        ):
            trainer.fit(on_step=bar.update)
    except (TrainingError, ModelError, LayoutError, RayStartError, FileNotFoundError) as exc:
        fail(str(exc))
    console.print(
        f"done: {trainer.step} steps; metrics {Path(out) / 'metrics.jsonl'}, "
        f"checkpoints {Path(out) / 'checkpoints'}"
    )


def plot_cmd(
    run: Annotated[str, typer.Argument(help="Run folder (with metrics.jsonl).")],
    out: Annotated[str | None, typer.Option(help="PNG path (default RUN/curves.png).")] = None,
) -> None:
    """Write PNG learning curves of a run."""
    from pathlib import Path

    from marl.train.plots import plot_run

    metrics = Path(run) / "metrics.jsonl"
    if not metrics.is_file():
        fail(f"{metrics} not found")
    if not metrics.read_text(errors="replace").strip():
        fail(f"{metrics} holds no steps yet")
    with writing(out or Path(run) / "curves.png"):
        path = plot_run(Path(run), Path(out) if out else None)
    typer.echo(f"wrote {path}")


@eval_app.command("exploitability")
def eval_exploitability_cmd(
    target: Annotated[
        str,
        typer.Argument(
            help="A bot name, a team YAML (untrained), a run, checkpoint or exported team folder."
        ),
    ],
    game: Annotated[str, typer.Option(help="kuhn_poker or leduc_poker.")] = "kuhn_poker",
    out: Annotated[str | None, typer.Option(help="Write the table and figure as JSON.")] = None,
    samples: Annotated[
        int,
        typer.Option(
            min=1,
            help="Reasonings sampled per information state for a think-decoding policy "
            "(its table is their mean, with a 95% bootstrap interval); exact "
            "policies ignore it.",
        ),
    ] = 16,
) -> None:
    """Exact exploitability of the table policy a player induces, per information state."""
    quiet_transformers()
    import json
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from marl import games
    from marl.agents.models import ModelError
    from marl.agents.participants import ParticipantLoader
    from marl.agents.tables import agent_report

    env = games.make(game) if game in games.names() else None
    if env is None or not hasattr(env, "root_state"):
        fail(
            f"exact exploitability needs a game with an exact tree: kuhn_poker, leduc_poker "
            f"(got {game!r})"
        )
    console = Console()
    try:
        with console.status(f"Reading {target}'s policy at every information state..."):
            agent = ParticipantLoader(game).load(target)
            report = agent_report(agent, game, samples)
    except (ModelError, FileNotFoundError, ValueError, TypeError) as exc:
        fail(str(exc))
    names = env.action_names
    table = Table(title=f"{target} on {game}")
    table.add_column("information state")
    for a in names:
        table.add_column(a, justify="right")
    for key in sorted(report.table):
        row = report.table[key]
        table.add_row(key, *[f"{row[i]:.3f}" if i in row else "" for i in range(len(names))])
    console.print(table)
    console.print(
        f"exploitability: {report.exploitability:.6f}  (NashConv {2 * report.exploitability:.6f})"
    )
    sampled = {}
    if report.interval is not None:
        lo, hi = report.interval
        console.print(
            f"{report.level:.0%} bootstrap interval [{lo:.6f}, {hi:.6f}] over "
            f"{report.samples} sampled reasonings per information state"
        )
        sampled = {"interval": [lo, hi], "samples": report.samples, "level": report.level}
    if out:
        with writing(out, partial=Path(out)):
            Path(out).write_text(
                json.dumps(
                    {
                        "game": game,
                        "target": target,
                        "exploitability": report.exploitability,
                        **sampled,
                        "table": report.table,
                    },
                    indent=1,
                )
            )


@eval_app.command("against")
def eval_against_cmd(
    target: Annotated[
        str,
        typer.Argument(
            help="A team YAML (untrained), a run, checkpoint or "
            "exported team folder, or a bot name."
        ),
    ],
    bot: Annotated[
        str,
        typer.Option(
            help="The opponent: a bot with fixed action probabilities (random, heuristic, optimal)."
        ),
    ] = "random",
    game: Annotated[
        str,
        typer.Option(
            help="A perfect-information game: tic_tac_toe, nim, connect_four (small boards)."
        ),
    ] = "tic_tac_toe",
    out: Annotated[str | None, typer.Option(help="Write the probabilities as JSON.")] = None,
) -> None:
    """Exact win, draw and loss probabilities against a bot, from every seat: the player's
    distribution is read at every position it can reach, and the game tree does the rest."""
    quiet_transformers()
    import json
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from marl import games
    from marl.agents.models import ModelError
    from marl.agents.participants import ParticipantLoader
    from marl.agents.tables import agent_probs, outcome_report
    from marl.games.bots import make_bot

    env = games.make(game) if game in games.names() else None
    if env is None or not getattr(env, "perfect_information", False):
        fail(
            f"exact outcomes need a perfect-information game: tic_tac_toe, nim, connect_four "
            f"(got {game!r})"
        )
    console = Console()
    try:
        opponent = make_bot(game, bot)
        if not hasattr(opponent, "action_probs"):
            fail(f"bot {bot!r} has no fixed action probabilities")
        with console.status(
            f"Reading {target}'s policy at every position it can reach against {bot}..."
        ):
            agent = ParticipantLoader(game).load(target)
            report = outcome_report(agent_probs(agent), game, opponent.action_probs)
    except (ModelError, FileNotFoundError, ValueError, TypeError, KeyError) as exc:
        fail(str(exc))
    table = Table(title=f"{target} against {bot} on {game} (exact)")
    for col in ("seat", "positions read", "win", "draw", "loss", "win+draw"):
        table.add_column(col, justify="left" if col == "seat" else "right")
    for seat, p in report.seats.items():
        table.add_row(
            seat,
            str(report.positions[seat]),
            f"{p['win']:.4f}",
            f"{p['draw']:.4f}",
            f"{p['loss']:.4f}",
            f"{p['win'] + p['draw']:.4f}",
        )
    console.print(table)
    both = sum(p["win"] + p["draw"] for p in report.seats.values()) / len(report.seats)
    console.print(f"win+draw over the seats: {both:.4f}")
    if out:
        with writing(out, partial=Path(out)):
            Path(out).write_text(
                json.dumps(
                    {
                        "game": game,
                        "target": target,
                        "bot": bot,
                        "seats": report.seats,
                        "positions": report.positions,
                        "win_draw": both,
                    },
                    indent=1,
                )
            )


@eval_app.command("population")
def eval_population_cmd(
    run: Annotated[
        str,
        typer.Argument(
            help="A training run folder (its checkpoints and the "
            "league snapshots inside them are the members)."
        ),
    ],
    out: Annotated[
        str | None, typer.Option(help="Where to write the mixture (default RUN/population.json).")
    ] = None,
    tol: Annotated[
        float, typer.Option(help="Certified gap to the least exploitable mixture.")
    ] = 1e-4,
) -> None:
    """The least exploitable mixture of a run's snapshots (exact exploitability); seat it in a
    tournament with the source RUN/population.json."""
    quiet_transformers()
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from marl.agents.models import ModelError
    from marl.infra.layout import POPULATION_FILE
    from marl.orchestrator.arena.population import solve_population

    console = Console()
    try:
        with console.status(f"Reading the policies of {run}'s snapshots..."):
            report = solve_population(Path(run), Path(out) if out else None, tol)
    except (ModelError, FileNotFoundError, ValueError, TypeError) as exc:
        fail(str(exc))
    table = Table(title=f"population of {run} on {report.game}")
    for col in ("member", "weight", "exploitability"):
        table.add_column(col, justify="left" if col == "member" else "right")
    for m, w, e in zip(report.members, report.weights, report.member_exploitability, strict=True):
        table.add_row(m.name, f"{w:.4f}", f"{e:.6f}")
    console.print(table)
    best = report.best_member
    console.print(
        f"mixture exploitability: {report.exploitability:.6f}  (lower bound "
        f"{report.lower_bound:.6f}); best member {report.members[best].name}: "
        f"{report.member_exploitability[best]:.6f}"
    )
    console.print(f"wrote {Path(out) if out else Path(run) / POPULATION_FILE}")


@eval_app.command("team")
def eval_team_cmd(
    run: Annotated[
        str,
        typer.Argument(
            help="Run folder (its latest checkpoint), RUN/best, a "
            "checkpoint or an exported team folder."
        ),
    ],
    tasks: Annotated[int, typer.Option(min=1, help="Held-out tasks per variant.")] = 60,
    seed: Annotated[int, typer.Option(help="First held-out task seed.")] = 1_000_000_000,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Decoding temperature of every role (0: greedy).")
    ] = 0.0,
    out: Annotated[
        str | None,
        typer.Option(
            help="Folder for credit.csv, credit.json and credit.png (default RUN/credit)."
        ),
    ] = None,
) -> None:
    """Credit and specialisation: the trained team, the untrained team, swapped adapters,
    each role reverted and each edge dropped, on the same held-out tasks."""
    quiet_transformers()
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from marl.agents.models import ModelError
    from marl.infra.layout import resolve
    from marl.orchestrator.arena.credit import CreditRow, credit_report
    from marl.orchestrator.team import TeamError
    from marl.topologies import TopologyError

    where = resolve(run)
    folder = Path(out) if out else (where.run or where.folder) / "credit"
    console = Console()
    with console.status("Evaluating the trained team...") as status:

        def done(row: CreditRow) -> None:
            console.print(f"{row.name}: {row.score.accuracy:.3f}")
            status.update(f"Evaluating the ablations ({row.name} done)...")

        try:
            report = credit_report(
                run, tasks=tasks, seed=seed, temperature=temperature, on_variant=done
            )
        except (ModelError, FileNotFoundError, TeamError, TopologyError, KeyError) as exc:
            fail(str(exc))
    table = Table(
        title=f"{report.team} on {report.game} ({tasks} held-out tasks, seeds from {seed})"
    )
    rows = report.table()
    defers = any(row["deferral_rate"] for row in rows)  # a column only for deferring teams
    for column in (
        "variant",
        "accuracy",
        "95% CI",
        "vs trained",
        "edges",
        "messages/task",
        "tokens/task",
    ) + (("deferred",) if defers else ()):
        table.add_column(column, justify="left" if column == "variant" else "right", no_wrap=True)
    for row in rows:
        table.add_row(
            row["variant"],
            f"{row['accuracy']:.3f}",
            f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]",
            f"{row['delta']:+.3f}",
            str(row["edges"]),
            f"{row['messages_per_task']:.2f}",
            f"{row['tokens_per_task']:.0f}",
            *((f"{row['deferral_rate']:.2f}",) if defers else ()),
        )
    console.print(table)
    paths = report.write(folder)
    console.print(f"wrote {paths['csv']}, {paths['json']} and {paths['png']}")


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
    app.command("plot")(plot_cmd)
    app.add_typer(eval_app, name="eval")
