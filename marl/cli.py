"""The ``marl`` command line: one typer app, sub-apps per concern."""

from __future__ import annotations

import os
from typing import Annotated

import typer

# Before torch loads libgomp: spinning OpenMP workers collapse when the 2 cores are shared
# (SmolLM2 greedy answer 15 s spinning vs 0.8 s passive on a loaded 2-core box).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="marl-teams: teams of LLM agents that learn together.")
models_app = typer.Typer(no_args_is_help=True, help="The model registry.")
app.add_typer(models_app, name="models")


# --- configs: validate / schema ---

def _game_name_check(cfg) -> list[tuple[tuple[str, ...], str]]:
    """Check ``game.name`` against the game registry (the schema itself cannot import games);
    a cooperative task's name (games.tasks) is fine too: a team can answer it in free text."""
    import games
    from games.tasks import task_names

    known = games.names()
    name = cfg.game.name
    if name not in known and name not in task_names():
        return [(("game", "name"), f"unknown game {name!r}; known: {', '.join(known)}")]
    return []


@app.command("validate")
def validate_cmd(
    files: Annotated[list[str], typer.Argument(metavar="FILE...", help="Team YAML files.")],
) -> None:
    """Check team files; prints FILE:LINE:COL: path: message per problem (exit 2 if any)."""
    from configs import validate_file

    failed = False
    for file in files:
        problems = validate_file(file, checks=[_game_name_check])
        for problem in problems:
            typer.echo(str(problem))
        if problems:
            failed = True
        else:
            typer.secho(f"{file}: ok", fg=typer.colors.GREEN)
    if failed:
        raise typer.Exit(2)


@app.command("schema")
def schema_cmd(
    out: Annotated[str | None, typer.Option("--out", help="Write the JSON Schema here.")] = None,
    tournament: Annotated[bool, typer.Option(
        "--tournament", help="Tournament files instead (docs/tournament.schema.json).")] = False,
) -> None:
    """Print the JSON Schema of team files (for editors and docs/schema.json)."""
    import json

    from configs import json_schema
    from configs.tournament import TournamentConfig

    text = json.dumps(json_schema(TournamentConfig) if tournament else json_schema(),
                      indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        from pathlib import Path

        Path(out).write_text(text, encoding="utf-8")


# --- models: list / chat ---

def _quiet_transformers() -> None:
    """Silence transformers' progress bars and info logs; the CLI shows its own spinner."""
    import os
    import warnings

    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader uses bare tqdm; read at import
    warnings.filterwarnings("ignore", module="transformers")
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hub_logging.set_verbosity_error()  # its per-retry warnings when the hub is unreachable
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@models_app.command("list")
def models_list_cmd() -> None:
    """Show registered models, where their weights come from, and whether they are cached."""
    from rich.console import Console
    from rich.table import Table

    from agents.models import DEFAULT_MODEL, ModelError, list_models, marl_home

    table = Table(title="marl-teams models")
    table.add_column("name", no_wrap=True)
    for column in ("description", "source", "cached"):
        table.add_column(column)
    for spec in list_models():
        if not spec.cache:
            cached = "n/a (in memory)"
        elif spec.is_cached():
            cached = "[green]yes[/green]"
        else:
            cached = "no (converted on first use)"
            if spec.check_available is not None:
                try:
                    spec.check_available()
                except ModelError as exc:
                    cached = f"[red]not installed[/red]: {exc}"
        table.add_row(spec.name, spec.description, spec.source, cached)
    console = Console()
    console.print(table)
    console.print(f"default: {DEFAULT_MODEL}; cache: {marl_home() / 'models'} ($MARL_HOME)",
                  highlight=False)


@app.command("chat")
def chat_cmd(
    prompt: Annotated[str, typer.Argument(help="What to ask.")],
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="Registry name, Hugging Face id or local path "
        "(default: smollm2-135m-instruct).")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Answer length cap.")] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
) -> None:
    """Ask a model one question and print its answer (chat template applied)."""
    _quiet_transformers()
    from rich.console import Console

    from agents.models import DEFAULT_MODEL, MODEL_REGISTRY, ModelError, generate, load_model

    ref = model or DEFAULT_MODEL
    spec = MODEL_REGISTRY.get(ref)
    status = (f"Converting {ref} (first use only, under a minute)..."
              if spec is not None and spec.needs_build() else f"Loading {ref}...")
    console = Console(stderr=True)
    try:
        with console.status(status):
            lm, tokenizer = load_model(ref)
        with console.status("Generating..."):
            answer = generate(lm, tokenizer, prompt, max_new_tokens=max_new_tokens,
                              temperature=temperature, seed=seed)
    except ModelError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(answer)


# --- play ---

def load_team(path: str, model: type | None = None, checks: tuple = ()):
    """Load and check a team file (or a ``model`` file, with extra ``checks``), or print its
    problems and exit 2."""
    from configs import ConfigError, TeamConfig, load_config

    try:
        return load_config(path, model or TeamConfig, checks=[_game_name_check, *checks])
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command("play")
def play_cmd(
    config: Annotated[str, typer.Argument(help="Team YAML file.")],
    game: Annotated[str | None, typer.Option(help="Game (default: the config's).")] = None,
    episodes: Annotated[int, typer.Option(min=1, help="Games to play.")] = 10,
    against: Annotated[str | None, typer.Option(
        help="Opponent: a bot name (random, heuristic, optimal) or a checkpoint/adapter "
             "folder. Default: self-play.")] = None,
    human: Annotated[bool, typer.Option("--human", help="You play the other seat.")] = False,
    seed: Annotated[int, typer.Option(help="First episode seed.")] = 0,
    concurrency: Annotated[int, typer.Option(min=1, help="Games played at once.")] = 16,
    out: Annotated[str, typer.Option(help="Transcripts JSONL.")] = "transcripts.jsonl",
    mode: Annotated[str | None, typer.Option(
        help="Decoding mode of every hf/vllm role: free or choice (default: each role's)."
    )] = None,
    temperature: Annotated[float | None, typer.Option(
        min=0.0, help="Sampling temperature of every hf/vllm role, 0 = greedy (default: each "
        "role's; a choice-mode temperature is often too hot for free text).")] = None,
) -> None:
    """Play the team's game and print wins/draws/losses per seat and the parse-error rate."""
    _quiet_transformers()
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress

    import games
    from agents import Agent
    from agents.builder import build_roster
    from agents.models import ModelError
    from agents.scripted import HumanPolicy
    from orchestrator.participants import ParticipantLoader
    from orchestrator.play import play, report_table

    cfg = load_team(config)
    if game is not None:
        if game not in games.names():
            fail(f"unknown game {game!r}; known: {', '.join(games.names())}")
        cfg = cfg.model_copy(update={"game": cfg.game.model_copy(update={"name": game,
                                                                          "kwargs": {}})})
    if mode is not None and mode not in ("free", "choice"):
        fail(f"--mode must be free or choice, got {mode!r}")
    decoding = {k: v for k, v in (("mode", mode), ("temperature", temperature)) if v is not None}
    if decoding:
        cfg = cfg.model_copy(update={"roles": [
            r.model_copy(update={"decoding": r.decoding.model_copy(update=decoding)})
            if r.backend in ("hf", "vllm") else r for r in cfg.roles]})
    console = Console()
    try:
        with console.status(f"Loading team {cfg.name}..."):
            roster = build_roster(cfg, seed=seed)
            opponents = None
            if human:
                opponents = [Agent("human", "human", HumanPolicy(), mode="free")]
                concurrency = 1
            elif against is not None:
                loader = ParticipantLoader(cfg.game.name, seed=seed + 1, hosts=roster.hosts)
                opponents = [loader.load(against)]
    except (ModelError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if opponents:
        n_seats = len(games.make(cfg.game.name, **cfg.game.kwargs).possible_agents)
        opponents = opponents * (n_seats - 1)
    with Progress(console=console, transient=True, disable=human) as bar:
        task = bar.add_task(f"{cfg.game.name}", total=episodes)
        report = play(roster, cfg.game.name, cfg.game.kwargs, episodes, opponents, seed=seed,
                      concurrency=concurrency, transcripts=Path(out),
                      on_episode=lambda ep: bar.advance(task))
    console.print(report_table(report, title=f"{cfg.name} on {cfg.game.name}"))
    console.print(f"transcripts: {out}")


# --- train / plot ---

@app.command("train")
def train_cmd(
    config: Annotated[str, typer.Argument(help="Team YAML file with a `train` section.")],
    out: Annotated[str, typer.Option("--out", help="Run folder.")] = "runs/latest",
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the last "
                                                           "checkpoint in --out.")] = False,
    address: Annotated[str | None, typer.Option(help="Ray cluster address (default: the "
                                                     "config's, else a local Ray).")] = None,
    steps: Annotated[int | None, typer.Option(help="Override train.steps.")] = None,
    max_minutes: Annotated[float | None, typer.Option(
        help="Override train.max_minutes (wall-clock budget).")] = None,
) -> None:
    """Train the team's adapters with multi-agent GRPO; metrics in OUT/metrics.jsonl."""
    _quiet_transformers()
    from pathlib import Path

    from rich.console import Console

    from agents.models import ModelError
    from marl.progress import TrainProgress
    from marl.trainer import Trainer, TrainingError

    cfg = load_team(config)
    if cfg.train is None:
        fail(f"{config}: no `train` section (see docs/schema.json)")
    tc = cfg.train
    if steps is not None:
        tc = tc.model_copy(update={"steps": steps})
    if max_minutes is not None:
        tc = tc.model_copy(update={"max_minutes": max_minutes})
    if address is not None:
        tc = tc.model_copy(update={"ray": tc.ray.model_copy(update={"address": address,
                                                                   "enabled": True})})
    cfg = cfg.model_copy(update={"train": tc})
    if not resume and (Path(out) / "latest").is_file():
        fail(f"{out} already holds a run: add --resume to continue it, or choose another --out")
    console = Console()
    try:
        with console.status("Starting the trainer (models, workers)..."):
            trainer = Trainer(cfg, Path(out), resume=resume)
        with TrainProgress(console, cfg.train.steps, start=trainer.step) as progress:
            trainer.fit(on_step=progress.update)
    except (TrainingError, ModelError, FileNotFoundError) as exc:
        fail(str(exc))
    console.print(f"done: {trainer.step} steps; metrics {Path(out) / 'metrics.jsonl'}, "
                  f"checkpoints {Path(out) / 'checkpoints'}")


@app.command("plot")
def plot_cmd(
    run: Annotated[str, typer.Argument(help="Run folder (with metrics.jsonl).")],
    out: Annotated[str | None, typer.Option(help="PNG path (default RUN/curves.png).")] = None,
) -> None:
    """Write PNG learning curves of a run."""
    from pathlib import Path

    from marl.plots import plot_run

    metrics = Path(run) / "metrics.jsonl"
    if not metrics.is_file():
        fail(f"{metrics} not found")
    path = plot_run(Path(run), Path(out) if out else None)
    typer.echo(f"wrote {path}")


# --- eval ---

eval_app = typer.Typer(no_args_is_help=True, help="Exact evaluation of players.")
app.add_typer(eval_app, name="eval")


@eval_app.command("exploitability")
def eval_exploitability_cmd(
    target: Annotated[str, typer.Argument(help="A bot name, a team YAML (untrained), a run, "
                                               "checkpoint or exported team folder.")],
    game: Annotated[str, typer.Option(help="kuhn_poker or leduc_poker.")] = "kuhn_poker",
    out: Annotated[str | None, typer.Option(help="Write the table and figure as JSON.")] = None,
) -> None:
    """Exact exploitability of the table policy a player induces, per information state."""
    _quiet_transformers()
    import json
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    import games
    from agents.models import ModelError
    from orchestrator.evaluation import agent_probs, bot_probs, exploitability_report
    from orchestrator.participants import ParticipantLoader

    env = games.make(game) if game in games.names() else None
    if env is None or not hasattr(env, "root_state"):
        fail(f"exact exploitability needs a game with an exact tree: kuhn_poker, leduc_poker "
             f"(got {game!r})")
    console = Console()
    try:
        with console.status(f"Reading {target}'s policy at every information state..."):
            agent = ParticipantLoader(game).load(target)
            read = (bot_probs(agent.policy.bot) if agent.role == "bot"
                    else agent_probs(agent))
            report = exploitability_report(read, game)
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
    console.print(f"exploitability: {report.exploitability:.6f}  "
                  f"(NashConv {2 * report.exploitability:.6f})")
    if out:
        Path(out).write_text(json.dumps({"game": game, "target": target,
                                         "exploitability": report.exploitability,
                                         "table": report.table}, indent=1))


# --- tournament ---

@app.command("tournament")
def tournament_cmd(
    config: Annotated[str, typer.Argument(help="Tournament YAML file (schema "
                                               "marl-teams/tournament/v1).")],
    out: Annotated[str, typer.Option("--out", help="Folder for matches.jsonl and the report; "
                                                   "rerun with the same folder to resume.")
                   ] = "runs/tournament",
) -> None:
    """Play a tournament, resuming from OUT/matches.jsonl, then rate it: ratings.csv,
    payoff.csv and report.html (with PNG charts) in OUT, the rating table on screen."""
    _quiet_transformers()
    from pathlib import Path

    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress

    from agents.models import ModelError
    from configs.tournament import TournamentConfig
    from orchestrator.report import ratings_table, write_report
    from orchestrator.tournament import Tournament, TournamentError, source_problems

    base = Path(config).parent
    cfg = load_team(config, TournamentConfig, checks=(lambda c: source_problems(c, base),))
    console = Console()
    try:
        tournament = Tournament(cfg, out, base)
        with console.status("Loading participants..."):
            tournament.load()
        columns = (*Progress.get_default_columns(), MofNCompleteColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(f"{cfg.name}: games", total=tournament.total,
                                completed=tournament.resumed)
            result = tournament.run(on_game=lambda rec: bar.advance(task))
    except (TournamentError, ModelError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    files = write_report(result.report, Path(out), title=cfg.name)
    console.print(ratings_table(result.report, title=f"{cfg.name} on {cfg.game.name}"))
    console.print(f"{len(result.records)} games ({result.resumed} read back from "
                  f"{Path(out) / 'matches.jsonl'}, {result.played} played); report: "
                  f"{files['report.html']}", highlight=False)


# --- export / serve / topology ---

@app.command("export")
def export_cmd(
    run: Annotated[str, typer.Argument(help="Run folder (its latest checkpoint) or a "
                                            "checkpoint folder.")],
    out: Annotated[str, typer.Option("--out", help="Folder to write the team to.")],
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out.")] = False,
    threshold: Annotated[float, typer.Option(help="Keep learned edges with p above this.")] = 0.5,
) -> None:
    """Write a self-contained team: team.yaml, LoRA adapters, model card (README.md)."""
    from configs import ConfigError
    from orchestrator.export import ExportError, export_run
    from topologies import TopologyError

    try:
        path = export_run(run, out, overwrite=force, threshold=threshold)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    except (ExportError, TopologyError, FileNotFoundError) as exc:
        fail(str(exc))
    typer.echo(f"exported to {path} (load: Team.load({str(path)!r}); serve: marl serve {path})")


def _load_runtime_team(source: str):
    """A Team from a team YAML (untrained) or a folder (exported team, run, checkpoint)."""
    from pathlib import Path

    from agents.models import ModelError
    from orchestrator.team import Team, TeamError
    from topologies import TopologyError

    try:
        if Path(source).is_file():
            return Team.from_config(load_team(source))
        return Team.load(source)
    except (ModelError, FileNotFoundError, TeamError, TopologyError) as exc:
        fail(str(exc))


@app.command("serve")
def serve_cmd(
    team: Annotated[str, typer.Argument(help="Exported team folder (or a run, checkpoint "
                                             "or team YAML).")],
    port: Annotated[int, typer.Option(min=0, max=65535, help="0 picks a free port.")] = 8000,
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")
                    ] = "127.0.0.1",
    api_key_env: Annotated[str | None, typer.Option(
        help="Require `Authorization: Bearer $VAR` (name of the variable).")] = None,
    max_batch: Annotated[int, typer.Option(min=1, help="Requests batched together.")] = 16,
) -> None:
    """Serve the team as an OpenAI-compatible API (/v1/chat/completions, /v1/models)."""
    _quiet_transformers()
    from rich.console import Console

    from orchestrator.serve import make_server

    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            fail(f"environment variable {api_key_env} (the API key) is not set")
    with Console(stderr=True).status(f"Loading {team}..."):
        runtime = _load_runtime_team(team)
    try:
        server = make_server(runtime, host, port, api_key=key, max_batch=max_batch)
    except OSError as exc:
        fail(f"cannot bind {host}:{port}: {exc.strerror or exc}")
    if host not in ("127.0.0.1", "localhost", "::1") and key is None:
        typer.echo(f"warning: serving on {host} without an API key (--api-key-env)", err=True)
    typer.echo(f"serving team {runtime.name!r} on {server.url} (model {server.model_id!r}); "
               "Ctrl-C to stop")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.batcher.close()


topology_app = typer.Typer(no_args_is_help=True, help="Communication topologies.")
app.add_typer(topology_app, name="topology")


@topology_app.command("show")
def topology_show_cmd(
    source: Annotated[str, typer.Argument(help="Team YAML, or an exported team, run or "
                                               "checkpoint folder.")],
    png: Annotated[str | None, typer.Option("--png", help="Also draw it to this PNG.")] = None,
) -> None:
    """Print the team's topology as Mermaid; learned edge probabilities as widths when the
    folder holds topology.safetensors."""
    from pathlib import Path

    from orchestrator.participants import checkpoint_folder
    from topologies import LearnableTopology, TopologyError, build_topology
    from topologies.render import draw_png, to_mermaid

    path = Path(source)
    folder = checkpoint_folder(path)
    if folder == path and path.is_file():  # a team file, not a run's pointer
        folder = None
    if folder is not None and not (folder / "team.yaml").is_file():
        fail(f"{source}: neither a team file nor a folder with team.yaml")
    cfg = load_team(str(path if folder is None else folder / "team.yaml"))
    learned = None if folder is None else folder / "topology.safetensors"
    try:
        if learned is not None and learned.is_file():
            graph = LearnableTopology.load(learned)
        else:
            graph = build_topology(cfg)
    except (TopologyError, ValueError) as exc:
        fail(str(exc))
    typer.echo(to_mermaid(graph), nl=False)
    if png is not None:
        draw_png(graph, png, title=cfg.name)
        typer.echo(f"wrote {png}", err=True)


if __name__ == "__main__":
    app()
