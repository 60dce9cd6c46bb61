"""``marl eval exploitability``, ``marl eval against``, ``marl eval population`` and
``marl eval team``: measuring players and teams, exactly where the game allows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from marl.cli.common import fail, quiet_transformers
from marl.cli.errors import write_json

if TYPE_CHECKING:
    from rich.table import Table

    from marl.agents.tables import ExploitabilityReport, OutcomeReport
    from marl.orchestrator.arena.credit import CreditReport

eval_app = typer.Typer(no_args_is_help=True, help="Evaluation of players and teams.")

PlayerTarget = Annotated[
    str,
    typer.Argument(
        help="A bot name, a team YAML (untrained), a run, checkpoint or exported team folder."
    ),
]
TreeGame = Annotated[str, typer.Option(help="kuhn_poker or leduc_poker.")]
TableOut = Annotated[str | None, typer.Option(help="Write the table and figure as JSON.")]
Samples = Annotated[
    int,
    typer.Option(
        min=1,
        help="Reasonings sampled per information state for a think-decoding policy "
        "(its table is their mean, with a 95% bootstrap interval); exact "
        "policies ignore it.",
    ),
]
AgainstTarget = Annotated[
    str,
    typer.Argument(
        help="A team YAML (untrained), a run, checkpoint or exported team folder, or a bot name."
    ),
]
Bot = Annotated[
    str,
    typer.Option(
        help="The opponent: a bot with fixed action probabilities (random, heuristic, optimal)."
    ),
]
PerfectGame = Annotated[
    str,
    typer.Option(help="A perfect-information game: tic_tac_toe, nim, connect_four (small boards)."),
]
ProbsOut = Annotated[str | None, typer.Option(help="Write the probabilities as JSON.")]
PopulationRun = Annotated[
    str,
    typer.Argument(
        help="A training run folder (its checkpoints and the "
        "league snapshots inside them are the members)."
    ),
]
PopulationOut = Annotated[
    str | None, typer.Option(help="Where to write the mixture (default RUN/population.json).")
]
Tol = Annotated[float, typer.Option(help="Certified gap to the least exploitable mixture.")]
TeamRun = Annotated[
    str,
    typer.Argument(
        help="Run folder (its latest checkpoint), RUN/best, a "
        "checkpoint or an exported team folder."
    ),
]
Tasks = Annotated[int, typer.Option(min=1, help="Held-out tasks per variant.")]
TaskSeed = Annotated[int, typer.Option(help="First held-out task seed.")]
Temperature = Annotated[
    float, typer.Option(min=0.0, help="Decoding temperature of every role (0: greedy).")
]
CreditOut = Annotated[
    str | None,
    typer.Option(help="Folder for credit.csv, credit.json and credit.png (default RUN/credit)."),
]


@eval_app.command("exploitability")
def eval_exploitability_cmd(
    target: PlayerTarget,
    game: TreeGame = "kuhn_poker",
    out: TableOut = None,
    samples: Samples = 16,
) -> None:
    """Exact exploitability of the table policy a player induces, per information state."""
    quiet_transformers()
    from rich.console import Console

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
    console.print(_policy_table(report, env.action_names, f"{target} on {game}"))
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
        write_json(
            out,
            {
                "game": game,
                "target": target,
                "exploitability": report.exploitability,
                **sampled,
                "table": report.table,
            },
        )


def _policy_table(report: ExploitabilityReport, names: list[str], title: str) -> Table:
    """One row per information state, one column per action: the policy's probabilities."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("information state")
    for a in names:
        table.add_column(a, justify="right")
    for key in sorted(report.table):
        row = report.table[key]
        table.add_row(key, *[f"{row[i]:.3f}" if i in row else "" for i in range(len(names))])
    return table


@eval_app.command("against")
def eval_against_cmd(
    target: AgainstTarget,
    bot: Bot = "random",
    game: PerfectGame = "tic_tac_toe",
    out: ProbsOut = None,
) -> None:
    """Exact win, draw and loss probabilities against a bot, from every seat: the player's
    distribution is read at every position it can reach, and the game tree does the rest."""
    quiet_transformers()
    from rich.console import Console

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
    console.print(_outcome_table(report, f"{target} against {bot} on {game} (exact)"))
    both = sum(p["win"] + p["draw"] for p in report.seats.values()) / len(report.seats)
    console.print(f"win+draw over the seats: {both:.4f}")
    if out:
        write_json(
            out,
            {
                "game": game,
                "target": target,
                "bot": bot,
                "seats": report.seats,
                "positions": report.positions,
                "win_draw": both,
            },
        )


def _outcome_table(report: OutcomeReport, title: str) -> Table:
    """One row per seat: positions read and the exact outcome probabilities."""
    from rich.table import Table

    table = Table(title=title)
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
    return table


@eval_app.command("population")
def eval_population_cmd(
    run: PopulationRun,
    out: PopulationOut = None,
    tol: Tol = 1e-4,
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
    run: TeamRun,
    tasks: Tasks = 60,
    seed: TaskSeed = 1_000_000_000,
    temperature: Temperature = 0.0,
    out: CreditOut = None,
) -> None:
    """Credit and specialisation: the trained team, the untrained team, swapped adapters,
    each role reverted and each edge dropped, on the same held-out tasks."""
    quiet_transformers()
    from pathlib import Path

    from rich.console import Console

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
    title = f"{report.team} on {report.game} ({tasks} held-out tasks, seeds from {seed})"
    console.print(_credit_table(report, title))
    paths = report.write(folder)
    console.print(f"wrote {paths['csv']}, {paths['json']} and {paths['png']}")


def _credit_table(report: CreditReport, title: str) -> Table:
    """One row per variant; the deferral column only for teams that defer at all."""
    from rich.table import Table

    table = Table(title=title)
    rows = report.table()
    defers = any(row["deferral_rate"] for row in rows)
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
    return table


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
