"""``marl play``: a team plays its game against itself, a bot, a checkpoint or a person."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from marl.cli import output
from marl.cli.common import fail, load_team, quiet_transformers
from marl.cli.errors import writing
from marl.cli.output import Json
from marl.infra.seats import UNTRAINED

if TYPE_CHECKING:
    from rich.console import Console

    from marl.config import TeamConfig
    from marl.orchestrator.arena.play import PlayReport


Config = Annotated[str, typer.Argument(help="Team YAML file.")]
Game = Annotated[str | None, typer.Option(help="Game (default: the config's).")]
Episodes = Annotated[int, typer.Option(min=1, help="Games to play.")]
Against = Annotated[
    str | None,
    typer.Option(
        help="Opponent: a bot name (random, heuristic, optimal), a run (its latest "
        "checkpoint), RUN/best, RUN/latest, a checkpoint or an exported team. Default: "
        "self-play."
    ),
]
Human = Annotated[
    bool,
    typer.Option("--human", help="You play against --against (default: the config's first role)."),
]
Seat = Annotated[
    str | None,
    typer.Option(help="With --human: the seat you take every game (default: seats alternate)."),
]
Seed = Annotated[int, typer.Option(help="First episode seed.")]
Concurrency = Annotated[int, typer.Option(min=1, help="Games played at once.")]
Out = Annotated[
    str | None,
    typer.Option(
        help="Output folder for transcripts.jsonl, or a .jsonl file (default: runs/play-<time>/)."
    ),
]
Mode = Annotated[
    str | None,
    typer.Option(
        help="Decoding mode of every hf/vllm role: free or choice (default: each role's)."
    ),
]
Temperature = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        help="Sampling temperature of every hf/vllm role, 0 = greedy (default: each "
        "role's; a choice-mode temperature is often too hot for free text).",
    ),
]


def play_cmd(
    config: Config,
    game: Game = None,
    episodes: Episodes = 10,
    against: Against = None,
    human: Human = False,
    seat: Seat = None,
    seed: Seed = 0,
    concurrency: Concurrency = 16,
    out: Out = None,
    mode: Mode = None,
    temperature: Temperature = None,
    json_out: Json = False,
) -> None:
    """Play the team's game and print wins/draws/losses per seat and the parse-error rate;
    with --human, play it yourself against a bot or a trained agent."""
    quiet_transformers()
    if human and json_out:
        fail("--json reports games between players; --human plays in this terminal")
    cfg = _team(config, game, mode, temperature)
    n_seats = _seats(config, cfg)
    if against is None and not human:
        against = _default_opponent(config, cfg, n_seats)
    _check_players(cfg, against, seat if human else None)
    console = output.console(json_out)
    with writing(out or "runs"):
        transcripts = transcript_file(out)
    if human:
        _play_human(cfg, against, episodes, seed, seat, transcripts, console)
        return
    report = _play_bots(cfg, against, n_seats, episodes, seed, concurrency, transcripts, console)
    if json_out:
        output.emit(_report_doc(report, cfg, transcripts))
        return
    from marl.orchestrator.arena.play import report_table

    output.show(console, report_table(report, title=f"{cfg.name} on {cfg.game.name}"))
    console.print(f"transcripts: {transcripts}", highlight=False, soft_wrap=True)


def _report_doc(report: PlayReport, cfg: TeamConfig, transcripts: Path) -> dict[str, Any]:
    """``--json``: outcomes and mean returns (95% intervals) per participant and seat, the
    first participant's margin over the others, the model-turn error counts."""
    from marl.orchestrator.arena.play import mean_interval

    def interval(values: list[float]) -> dict[str, float | int]:
        mean, half = mean_interval(values)
        return {"mean": mean, "low": mean - half, "high": mean + half, "games": len(values)}

    return {
        "team": cfg.name,
        "game": cfg.game.name,
        "episodes": report.episodes,
        "records": [
            {"participant": name, "seat": seat, "games": rec.games, "wins": rec.wins}
            | {"draws": rec.draws, "losses": rec.losses, "return": interval(rec.returns)}
            for (name, seat), rec in sorted(report.records.items())
        ],
        "margin": (
            {"participant": report.first} | interval(report.margins) if report.margins else None
        ),
        "model_turns": report.model_turns,
        "parse_errors": report.parse_errors,
        "parse_error_rate": report.parse_error_rate,
        "illegal_moves": report.illegal_moves,
        "forfeits": report.forfeits,
        "transcripts": str(transcripts),
    }


def _team(config: str, game: str | None, mode: str | None, temperature: float | None) -> TeamConfig:
    """The team file with ``--game``, ``--mode`` and ``--temperature`` applied, or exit 2."""
    from marl import games

    cfg = load_team(config)
    if game is not None:
        problem = games.check_name(game)
        if problem is not None:
            fail(problem)
        cfg = cfg.with_game(game)
    if mode is not None and mode not in ("free", "choice"):
        fail(f"--mode must be free or choice, got {mode!r}")
    return cfg.with_decoding(mode=mode, temperature=temperature)


def _seats(config: str, cfg: TeamConfig) -> int:
    """The number of seats of the team's game, or exit 2 when its kwargs do not fit."""
    from marl import games

    try:
        return len(games.make_from_config(cfg.game).possible_agents)
    except (TypeError, ValueError) as exc:
        fail(f"{config}: game.kwargs {cfg.game.kwargs} do not fit {cfg.game.name}: {exc}")


def _check_players(cfg: TeamConfig, against: str | None, seat: str | None) -> None:
    """Exit 2 on an opponent that names nothing or a seat the game lacks, before any model
    loads."""
    from marl import games
    from marl.cli.targets import check_target

    if against is not None:
        check_target(against, cfg.game.name)
    seats = games.make_from_config(cfg.game).possible_agents
    if seat is not None and seat not in seats:
        fail(f"--seat {seat}: {cfg.game.name} has the seats {', '.join(seats)}")


def _default_opponent(config: str, cfg: TeamConfig, n_seats: int) -> str | None:
    """Self-play (None) when the team fills every seat, else the config's first league anchor."""
    n_agents = sum(r.count for r in cfg.roles)
    if n_agents >= n_seats:
        return None
    anchors = cfg.train.league.anchors if cfg.train is not None else []
    if not anchors:
        fail(
            f"{config}: {n_agents} agent(s) for the {n_seats} seats of "
            f"{cfg.game.name}: pass --against (a bot or a checkpoint) or --human"
        )
    typer.echo(
        f"playing against {anchors[0]} (the config's first league anchor; --against to choose)",
        err=True,
    )
    return config if anchors[0] == UNTRAINED else anchors[0]  # a team file plays untrained


def _play_bots(
    cfg: TeamConfig,
    against: str | None,
    n_seats: int,
    episodes: int,
    seed: int,
    concurrency: int,
    transcripts: Path,
    console: Console,
) -> PlayReport:
    """The team against itself or ``against`` in the other seats: the games' report."""
    from rich.progress import Progress

    from marl.agents.builder import build_roster
    from marl.agents.models import ModelError
    from marl.agents.participants import ParticipantLoader
    from marl.orchestrator.arena.play import play

    try:
        with console.status(f"Loading team {cfg.name}..."):
            roster = build_roster(cfg, seed=seed)
            opponents = None
            if against is not None:
                loader = ParticipantLoader(cfg.game.name, seed=seed + 1, hosts=roster.hosts)
                opponents = [loader.load(against)] * (n_seats - 1)
    except (ModelError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    with (
        writing(transcripts, partial=transcripts),
        Progress(console=console, transient=True) as bar,
    ):
        task = bar.add_task(f"{cfg.game.name}", total=episodes)
        report = play(
            roster,
            cfg.game,
            None,
            episodes,
            opponents,
            seed=seed,
            concurrency=concurrency,
            transcripts=transcripts,
            on_episode=lambda ep: bar.advance(task),
        )
    return report


def transcript_file(out: str | None) -> Path:
    """Where ``--out`` puts the transcripts: a ``.jsonl`` file (or an existing non-folder such
    as a device) as given, else ``transcripts.jsonl`` in the folder (default a fresh
    ``runs/play-<time>/``), which is created."""
    if out is not None and (
        out.endswith(".jsonl") or Path(out).exists() and not Path(out).is_dir()
    ):
        path = Path(out)
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path(out or f"runs/play-{stamp}") / "transcripts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _play_human(
    cfg: TeamConfig,
    against: str | None,
    episodes: int,
    seed: int,
    seat: str | None,
    transcripts: Path,
    console: Console,
) -> None:
    """A person against ``against`` (a bot or a trained team), else the config's first role."""
    from marl.agents.builder import build_roster
    from marl.agents.models import ModelError
    from marl.agents.participants import ParticipantLoader
    from marl.orchestrator.arena.human import play_human

    try:
        with console.status("Loading your opponent..."):
            if against is not None:
                opponent = ParticipantLoader(cfg.game.name, seed=seed + 1).load(against)
            else:
                opponent = build_roster(cfg, seed=seed).agents[0]
    except (ModelError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if against is None:
        role = cfg.roles[0]
        console.print(
            f"no --against: you play {cfg.name}'s first role {role.name!r} "
            f"({role.model}, untrained); pass --against RUN/best for a trained one",
            markup=False,
        )
    else:
        console.print(f"you play against {opponent.name} ({against})", markup=False)
    try:
        with writing(transcripts, partial=transcripts):
            summary = play_human(
                opponent,
                cfg.game,
                episodes,
                seed=seed,
                seat=seat,
                console=console,
                transcripts=transcripts,
            )
    except ValueError as exc:
        fail(str(exc))
    console.rule("summary")
    console.print(summary.text(), markup=False)
    console.print(f"transcripts: {transcripts}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("play")(play_cmd)
