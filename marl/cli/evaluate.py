"""``marl eval exploitability``, ``marl eval against``, ``marl eval population`` and
``marl eval team``: measuring players and teams, exactly where the game allows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from marl.cli import output
from marl.cli.common import fail, quiet_transformers
from marl.cli.errors import write_json
from marl.cli.exploitability import Shown, emit_reasonings, emit_report
from marl.cli.output import Json
from marl.cli.targets import check_folder, check_target, check_think_target, target_game

if TYPE_CHECKING:
    from rich.table import Table

    from marl.agents.tables import OutcomeReport
    from marl.orchestrator.arena.credit import CreditReport

eval_app = typer.Typer(no_args_is_help=True, help="Evaluation of players and teams.")

PlayerTarget = Annotated[
    str,
    typer.Argument(
        help="A bot name, a team YAML (untrained), a run, checkpoint or exported team folder."
    ),
]
TreeGame = Annotated[
    str | None,
    typer.Option(
        help="A game with an exact tree (kuhn_poker, leduc_poker); default: the game of the "
        "run, checkpoint or team file, else kuhn_poker."
    ),
]
ShowTable = Annotated[
    bool, typer.Option("--table", help="Also print the policy, one row per information state.")
]
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
ReasoningMode = Annotated[
    str | None,
    typer.Option(
        show_default="own",
        help="Think-decoding policies only: score the move after each state's own sampled "
        "reasoning (own), after an empty one (empty), or after one sampled at another "
        "information state of the same player (swap, a seeded derangement); all: the three "
        "side by side on the same samples.",
    ),
]
Show = Annotated[
    int,
    typer.Option(
        min=0,
        help="Think-decoding policies only: print N of the sampled reasonings per "
        "information state, each with the policy after it.",
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
    str | None,
    typer.Option(
        help="A perfect-information game (tic_tac_toe, nim, connect_four on small boards); "
        "default: the game of the run, checkpoint or team file, else tic_tac_toe."
    ),
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
    game: TreeGame = None,
    out: TableOut = None,
    samples: Samples = 16,
    reasoning: ReasoningMode = None,
    show: Show = 0,
    table: ShowTable = False,
    json_out: Json = False,
) -> None:
    """Exact exploitability of the table policy a player induces (on the game a run, checkpoint
    or team file carries; --table prints its policy per information state).  A think policy
    is read from sampled reasonings: --reasoning empty, swap or all scores its move after
    other reasonings than its own, --show N prints some (docs/algorithms.md#think-then-act);
    a free-text policy from sampled answers, with the share of unplayable ones."""
    quiet_transformers()
    from marl import games
    from marl.agents.models import ModelError
    from marl.agents.participants import ParticipantLoader
    from marl.agents.reasoning import reasoning_reports, writes_reasoning
    from marl.agents.tables import agent_report
    from marl.games.analysis import tree_games

    game = target_game(target, game, "kuhn_poker").name  # the tree is the game's, kwargs aside
    env = games.make(game) if game in games.names() else None
    if env is None or not hasattr(env, "root_state"):
        fail(
            f"exact exploitability needs a game with an exact tree: {', '.join(tree_games())} "
            f"(got {game!r})"
        )
    check_target(target, game)
    modes = _reasoning_modes(target, game, reasoning, show)
    console = output.console(json_out)
    try:
        with console.status(f"Reading {target}'s policy at every information state..."):
            agent = ParticipantLoader(game).load(target)
            if modes or writes_reasoning(agent):
                reports = reasoning_reports(agent, game, modes or ["own"], samples)
            else:
                reports = agent_report(agent, game, samples)
    except (ModelError, FileNotFoundError, ValueError, TypeError) as exc:
        fail(str(exc))
    shown = Shown(target, game, env.action_names, out, json_out, table, show)
    if isinstance(reports, list):
        emit_reasonings(reports, shown)
    else:
        emit_report(reports, shown)


def _reasoning_modes(target: str, game: str, reasoning: str | None, show: int) -> list[str]:
    """The reasoning modes asked for (none: the default), refused with exit 2 before any
    model loads for a value that is none or a target that writes no reasoning."""
    from marl.agents.reasoning import MODES

    if reasoning is not None and reasoning not in (*MODES, "all"):
        fail(f"--reasoning must be one of {', '.join(MODES)} or all, got {reasoning!r}")
    for option, given in (("--reasoning", reasoning is not None), ("--show", show > 0)):
        if given:
            check_think_target(target, game, option)
    if reasoning is None:
        return []
    return list(MODES) if reasoning == "all" else [reasoning]


@eval_app.command("against")
def eval_against_cmd(
    target: AgainstTarget,
    bot: Bot = "random",
    game: PerfectGame = None,
    out: ProbsOut = None,
    json_out: Json = False,
) -> None:
    """Exact win, draw and loss probabilities against a bot, from every seat: the player's
    distribution is read at every position it can reach, and the game tree does the rest."""
    quiet_transformers()
    import functools

    from marl import games
    from marl.agents.models import ModelError
    from marl.agents.participants import ParticipantLoader
    from marl.agents.tables import agent_probs, outcome_report

    config = target_game(target, game, "tic_tac_toe")
    game = config.name
    opponent = _fixed_bot(game, bot)
    check_target(target, game)
    board = functools.partial(games.make_from_config, config)  # its kwargs: a board's size
    console = output.console(json_out)
    try:
        with console.status(
            f"Reading {target}'s policy at every position it can reach against {bot}..."
        ):
            agent = ParticipantLoader(game).load(target)
            report = outcome_report(agent_probs(agent), board, opponent.action_probs)
    except (ModelError, FileNotFoundError, ValueError, TypeError, KeyError) as exc:
        fail(str(exc))
    both = sum(p["win"] + p["draw"] for p in report.seats.values()) / len(report.seats)
    doc = {
        "game": game,
        "kwargs": config.kwargs,
        "target": target,
        "bot": bot,
        "seats": report.seats,
        "positions": report.positions,
        "win_draw": both,
    }
    if out:
        write_json(out, doc)
    if json_out:
        output.emit(doc)
        return
    output.show(console, _outcome_table(report, f"{target} against {bot} on {game} (exact)"))
    console.print(f"win+draw over the seats: {both:.4f}", highlight=False)


def _fixed_bot(game: str, bot: str) -> Any:
    """``game``'s bot ``bot`` if the game is a perfect-information one and the bot has fixed
    action probabilities, else exit 2 (before any model loads)."""
    from marl import games
    from marl.games.bots import UnknownBotError, make_bot

    env = games.make(game) if game in games.names() else None
    if env is None or not getattr(env, "perfect_information", False):
        known = [n for n in games.names() if getattr(games.make(n), "perfect_information", False)]
        fail(f"exact outcomes need a perfect-information game: {', '.join(known)} (got {game!r})")
    try:
        opponent = make_bot(game, bot)
    except UnknownBotError as exc:
        fail(str(exc))
    if not hasattr(opponent, "action_probs"):
        fail(f"bot {bot!r} has no fixed action probabilities")
    return opponent


def _outcome_table(report: OutcomeReport, title: str) -> Table:
    """One row per seat: positions read and the exact outcome probabilities."""
    numbers = ("positions read", "win", "draw", "loss", "win+draw")
    shown = output.table(title, {"seat": "left", **dict.fromkeys(numbers, "right")})
    for seat, p in report.seats.items():
        shown.add_row(
            seat,
            str(report.positions[seat]),
            f"{p['win']:.4f}",
            f"{p['draw']:.4f}",
            f"{p['loss']:.4f}",
            f"{p['win'] + p['draw']:.4f}",
        )
    return shown


@eval_app.command("population")
def eval_population_cmd(
    run: PopulationRun,
    out: PopulationOut = None,
    tol: Tol = 1e-4,
    json_out: Json = False,
) -> None:
    """The least exploitable mixture of a run's snapshots (exact exploitability); seat it in a
    tournament with the source RUN/population.json."""
    quiet_transformers()
    from pathlib import Path

    from marl.agents.models import ModelError
    from marl.infra.layout import CHECKPOINTS, POPULATION_FILE
    from marl.orchestrator.arena.population import solve_population

    check_folder(run)
    if not (Path(run) / CHECKPOINTS).is_dir():
        fail(f"{run} is not a training run folder (it has no {CHECKPOINTS}/)")
    console = output.console(json_out)
    try:
        with console.status(f"Reading the policies of {run}'s snapshots..."):
            report = solve_population(Path(run), Path(out) if out else None, tol)
    except (ModelError, FileNotFoundError, ValueError, TypeError) as exc:
        fail(str(exc))
    written = Path(out) if out else Path(run) / POPULATION_FILE
    if json_out:
        output.emit({**report.to_json(), "written": str(written)})
        return
    shown = output.table(
        f"population of {run} on {report.game}",
        {"member": "left", "weight": "right", "exploitability": "right"},
    )
    for m, w, e in zip(report.members, report.weights, report.member_exploitability, strict=True):
        shown.add_row(m.name, f"{w:.4f}", f"{e:.6f}")
    output.show(console, shown)
    best = report.best_member
    console.print(
        f"mixture exploitability: {report.exploitability:.6f}  (lower bound "
        f"{report.lower_bound:.6f}); best member {report.members[best].name}: "
        f"{report.member_exploitability[best]:.6f}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"wrote {written}", highlight=False)


@eval_app.command("team")
def eval_team_cmd(
    run: TeamRun,
    tasks: Tasks = 60,
    seed: TaskSeed = 1_000_000_000,
    temperature: Temperature = 0.0,
    out: CreditOut = None,
    json_out: Json = False,
) -> None:
    """Credit and specialisation: the trained team, the untrained team, swapped adapters,
    each role reverted and each edge dropped, on the same held-out tasks."""
    quiet_transformers()
    from pathlib import Path

    from marl.agents.models import ModelError
    from marl.infra.layout import LayoutError, resolve
    from marl.orchestrator.arena.credit import CreditRow, credit_report
    from marl.orchestrator.team import TeamError
    from marl.topologies import TopologyError

    check_folder(run)
    try:
        where = resolve(run)
    except LayoutError as exc:
        fail(str(exc))
    folder = Path(out) if out else (where.run or where.folder) / "credit"
    console = output.console(json_out)
    with console.status("Evaluating the trained team...") as status:

        def done(row: CreditRow) -> None:
            if not json_out:
                console.print(f"{row.name}: {row.score.accuracy:.3f}", highlight=False)
            status.update(f"Evaluating the ablations ({row.name} done)...")

        try:
            report = credit_report(
                run, tasks=tasks, seed=seed, temperature=temperature, on_variant=done
            )
        except (ModelError, FileNotFoundError, TeamError, TopologyError, KeyError) as exc:
            fail(str(exc))
    paths = report.write(folder)
    if json_out:
        output.emit({**report.to_dict(), "written": {k: str(p) for k, p in paths.items()}})
        return
    title = f"{report.team} on {report.game} ({tasks} held-out tasks, seeds from {seed})"
    output.show(console, _credit_table(report, title))
    console.print(f"wrote {paths['csv']}, {paths['json']} and {paths['png']}", highlight=False)


def _credit_table(report: CreditReport, title: str) -> Table:
    """One row per variant; the deferral column only for teams that defer at all."""
    rows = report.table()
    defers = any(row["deferral_rate"] for row in rows)
    numbers = ("accuracy", "95% CI", "vs trained", "edges", "messages/task", "tokens/task")
    shown = output.table(
        title,
        {"variant": "left", **dict.fromkeys(numbers + (("deferred",) if defers else ()), "right")},
    )
    for row in rows:
        shown.add_row(
            row["variant"],
            f"{row['accuracy']:.3f}",
            f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]",
            f"{row['delta']:+.3f}",
            str(row["edges"]),
            f"{row['messages_per_task']:.2f}",
            f"{row['tokens_per_task']:.0f}",
            *((f"{row['deferral_rate']:.2f}",) if defers else ()),
        )
    return shown


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
