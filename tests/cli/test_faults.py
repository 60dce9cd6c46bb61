"""Hostile input and faults: an export never deletes what it exports, pointers stay inside
their run, a killed run's temps and torn metrics line are cleaned on resume, and every bad
config, diverging run, full disk or unreachable cluster ends in one ``error:`` line (exit 2)."""

from __future__ import annotations

import json
import re
import socket
import stat
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import tiny_team
from marl.agents.policy import PolicyError, Request, choice_response
from marl.cli import app
from marl.config import load_config
from marl.config.tournament import TournamentConfig
from marl.games.rps import ParallelRockPaperScissors
from marl.infra.actors import RayStartError, start_ray
from marl.infra.layout import BEST, LATEST, METRICS, LayoutError, latest_checkpoint, point
from marl.orchestrator.arena.tournament import IDENTITY, Tournament
from marl.train.checkpoint import save_checkpoint
from marl.train.loggers import JsonlLogger
from marl.train.trainer import Trainer, TrainingError

REPO = Path(__file__).parents[2]
TINY = REPO / "configs" / "tiny_test.yaml"
VS_RANDOM = REPO / "configs" / "tictactoe_vs_random_tiny.yaml"
TRAIN = "  steps: 1\n  group_size: 2\n  groups_per_step: 1\n  ray: {enabled: false}\n"


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def refused(code: int, output: str, *words: str) -> None:
    """Exit 2 with one ``error:`` line that says ``words``, and no traceback."""
    assert code == 2, output
    assert "error:" in output and "Traceback" not in output, output
    for w in words:
        assert w in output, output


def located(code: int, output: str, field: str, *words: str) -> None:
    """Exit 2 with the config loader's ``FILE:LINE:COL: field: message`` line, no traceback."""
    assert code == 2, output
    assert re.search(rf"\.yaml:\d+:\d+: {re.escape(field)}: ", output), output
    assert "Traceback" not in output, output
    for w in words:
        assert w in output, output


def tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    """``work/run`` (one checkpoint, no adapters) next to an unrelated ``work/notes.txt``."""
    tiny = load_config(TINY)
    cfg = tiny.model_copy(update={"roles": [tiny.roles[0].model_copy(update={"adapter": None})]})
    work = tmp_path / "work"
    save_checkpoint(work / "run", 1, cfg, {}, {}, {}, {"league": {}})
    (work / "run" / METRICS).write_text('{"step": 1}\n')
    (work / "notes.txt").write_text("keep me")
    return work


# ----- export deletes nothing but an earlier export


@pytest.mark.parametrize(
    "where, says",
    [
        (".", "contains"),
        ("run", "contains"),
        ("run/checkpoints", "contains"),
        ("run/checkpoints/step_000001/team", "is inside"),
    ],
)
def test_export_refuses_an_output_over_its_source(
    work: Path, where: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = tree(work)
    monkeypatch.chdir(work)
    refused(*cli("export", "run", "--out", where, "--force"), says)
    refused(*cli("export", str(work / "run"), "--out", str(work.parent), "--force"), "contains")
    assert tree(work) == before


def test_force_replaces_only_an_earlier_export(work: Path) -> None:
    other = work / "other"
    other.mkdir()
    (other / "data.csv").write_text("precious")
    refused(
        *cli("export", str(work / "run"), "--out", str(other), "--force"), "not an earlier export"
    )
    assert (other / "data.csv").read_text() == "precious"
    refused(
        *cli("export", str(work / "run"), "--out", str(work / "notes.txt"), "--force"),
        "not a plain folder",
    )
    out = work / "team"
    assert cli("export", str(work / "run"), "--out", str(out))[0] == 0
    (out / "stale").write_text("")
    code, output = cli("export", str(work / "run"), "--out", str(out), "--force")
    assert code == 0, output
    assert (out / "export.json").is_file() and not (out / "stale").exists()


# ----- pointers and orphaned temps


@pytest.mark.parametrize("target", ["../../elsewhere", "/tmp", "step_1/../../x", ""])
def test_a_pointer_outside_its_run_is_an_error(work: Path, target: str) -> None:
    run = work / "run"
    (run / LATEST).write_text(target)
    with pytest.raises(LayoutError, match=str(run / LATEST)):
        latest_checkpoint(run)
    before = tree(work)
    refused(*cli("export", str(run), "--out", str(work / "out")), str(run / LATEST))
    assert tree(work) == before


def test_trainer_start_cleans_a_killed_runs_temps_and_torn_metrics(tmp_path: Path) -> None:
    config, run = tmp_path / "t.yaml", tmp_path / "run"
    config.write_text(tiny_team("kuhn_poker", TRAIN))
    code, output = cli("train", str(config), "--out", str(run))
    assert code == 0, output
    orphans = [run / "checkpoints" / ".step_000002.tmp-dead", run / f".{LATEST}.tmp-dead"]
    orphans[0].mkdir()
    orphans[1].write_text("step_000002")
    with (run / METRICS).open("a") as f:
        f.write('{"step": 2, "agen')  # a kill in the middle of a line
    code, output = cli("train", str(config), "--out", str(run), "--resume", "--steps", "2")
    assert code == 0, output
    assert [json.loads(ln)["step"] for ln in (run / METRICS).read_text().splitlines()] == [
        0,
        1,
        2,
    ]  # step 0: the untrained policy's exact evaluation
    assert not any(p.exists() for p in orphans)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    (tmp_path / "a_file").write_text("")
    refused(*cli("plot", str(run), "--out", str(tmp_path / "a_file" / "c.png")), "cannot write")


def test_resumed_metrics_cut_a_torn_last_line(tmp_path: Path) -> None:
    (tmp_path / METRICS).write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    JsonlLogger(tmp_path, load_config(TINY), 2).close()
    assert (tmp_path / METRICS).read_text() == '{"step": 1}\n{"step": 2}\n'


# ----- bad configs and diverging runs: one line, exit 2


def test_bad_game_kwargs_unknown_bots_and_targets(tmp_path: Path) -> None:
    kwargs = tmp_path / "kwargs.yaml"
    kwargs.write_text(
        tiny_team("kuhn_poker", TRAIN).replace(
            "game: {name: kuhn_poker}", "game: {name: kuhn_poker, kwargs: {foo: 1}}"
        )
    )
    located(*cli("train", str(kwargs), "--out", str(tmp_path / "r")), "game.kwargs", "foo")
    located(*cli("play", str(kwargs), "--episodes", "1"), "game.kwargs", "foo")
    bot = tmp_path / "bot.yaml"
    bot.write_text(
        tiny_team(
            "kuhn_poker",
            TRAIN,
            count=1,
            extra=("  - {name: b, backend: scripted, model: nosuchbot}\n"),
        )
    )
    located(  # found by the file's checks, before any model loads
        *cli("play", str(bot), "--episodes", "1", "--out", str(tmp_path / "t.jsonl")),
        "roles.1.model",
        "no bot 'nosuchbot'",
    )
    targets = tmp_path / "targets.yaml"
    targets.write_text(
        tiny_team("kuhn_poker", TRAIN).replace(
            "adapter: {r: 4, alpha: 8}", "adapter: {r: 4, alpha: 8, targets: [nope_proj]}"
        )
    )
    refused(
        *cli("train", str(targets), "--out", str(tmp_path / "r2")), "adapter.targets", "nope_proj"
    )
    assert not (tmp_path / "t.jsonl").exists()


def test_a_diverging_run_stops_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "t.yaml").write_text(tiny_team("kuhn_poker", TRAIN))
    trainer = Trainer(load_config(tmp_path / "t.yaml"), tmp_path / "r")
    diverged = {
        r: {k: v * float("inf") for k, v in w.items()} for r, w in trainer.runtime.weights().items()
    }
    monkeypatch.setattr(trainer.runtime, "weights", lambda: diverged)
    with pytest.raises(TrainingError, match="diverged.*train.lr"):
        trainer.fit()
    assert not (tmp_path / "r" / LATEST).exists()


def test_non_finite_choice_scores_are_a_policy_error() -> None:
    import random

    request = Request(messages=[], legal=[0, 1], action_texts=["[a]", "[b]"])
    with pytest.raises(PolicyError, match="non-finite"):
        choice_response(request, [], [[1], [2]], [float("nan"), 0.0], 1.0, random.Random(0))


def test_play_without_against_uses_the_league_anchor_or_says_what_is_missing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "t.jsonl"
    code, output = cli("play", str(VS_RANDOM), "--episodes", "2", "--out", str(out))
    assert code == 0 and "against random" in output, output
    assert len(out.read_text().splitlines()) == 2
    lonely = tmp_path / "lonely.yaml"
    lonely.write_text(tiny_team("kuhn_poker", TRAIN + "  league: {opponents: league}\n", count=1))
    refused(*cli("play", str(lonely)), "--against", "2 seats")


# ----- full disks, unwritable folders, unreachable clusters


def test_unwritable_outputs_are_one_error_line(tmp_path: Path, work: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    under = str(blocker / "sub")  # NotADirectoryError: what a read-only folder is for root
    refused(*cli("schema", "--out", "/dev/full"), "cannot write /dev/full")
    refused(*cli("schema", "--out", under), under)
    refused(
        *cli("eval", "exploitability", "random", "--out", "/dev/full"),
        "cannot write /dev/full",
        "No space left",
    )
    refused(*cli("eval", "exploitability", "random", "--out", under), "cannot write")
    refused(*cli("export", str(work / "run"), "--out", under), "cannot write")
    refused(
        *cli("play", str(VS_RANDOM), "--episodes", "1", "--out", "/dev/full"),
        "cannot write /dev/full",
    )
    refused(*cli("play", str(VS_RANDOM), "--episodes", "1", "--out", under), "cannot write")
    refused(*cli("train", str(VS_RANDOM), "--out", under), "cannot write")
    tournament = tmp_path / "t.yaml"
    tournament.write_text(
        "schema: marl-teams/tournament/v1\nname: t\ngame: {name: kuhn_poker}\n"
        "participants:\n  - {name: random, source: random}\n"
        "  - {name: optimal, source: optimal}\ngames_per_pairing: 2\n"
        "anchor: optimal\nbootstrap: 5\n"
    )
    refused(*cli("tournament", str(tournament), "--out", under), "cannot write")
    assert stat.S_ISCHR(Path("/dev/full").stat().st_mode)  # never replaced nor removed
    assert blocker.read_text() == ""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_ray_address_fails_at_once(tmp_path: Path) -> None:
    address = f"127.0.0.1:{closed_port()}"
    t = time.monotonic()
    with pytest.raises(RayStartError, match=address):
        start_ray(address)
    config = tmp_path / "ray.yaml"
    config.write_text(tiny_team("kuhn_poker", TRAIN))
    refused(
        *cli("train", str(config), "--out", str(tmp_path / "r"), "--address", address),
        "cannot reach the Ray cluster",
        address,
    )
    assert time.monotonic() - t < 60


# ----- ratings that do not depend on the order games were written


def test_ratings_do_not_depend_on_the_order_games_were_written(tmp_path: Path) -> None:
    cfg = TournamentConfig.model_validate(
        {
            "schema": "marl-teams/tournament/v1",
            "name": "t",
            "game": {"name": "kuhn_poker"},
            "participants": [
                {"name": "random", "source": "random"},
                {"name": "heuristic", "source": "heuristic"},
                {"name": "optimal", "source": "optimal"},
            ],
            "games_per_pairing": 20,
            "anchor": "optimal",
            "bootstrap": 30,
        }
    )
    first = Tournament(cfg, tmp_path / "a").run()
    lines = (tmp_path / "a" / "matches.jsonl").read_text().splitlines(keepends=True)
    shuffled = tmp_path / "b"
    shuffled.mkdir()
    (shuffled / IDENTITY).write_bytes((tmp_path / "a" / IDENTITY).read_bytes())
    (shuffled / "matches.jsonl").write_text("".join(lines[::-1]))
    again = Tournament(cfg, shuffled).run()
    assert again.played == 0 and again.resumed == len(lines)
    assert again.report.ratings == first.report.ratings  # points, intervals and Elo
    np.testing.assert_array_equal(again.report.payoff, first.report.payoff)


# ----- parallel rock-paper-scissors


def test_parallel_rps_both_invalid_moves_both_lose() -> None:
    env = ParallelRockPaperScissors(rounds=3)
    env.reset(seed=0)
    _, rewards, terms, _, infos = env.step({"player_0": 9, "player_1": "paper"})
    assert rewards == {"player_0": -1.0, "player_1": -1.0}
    assert all(terms.values()) and env.agents == []
    assert infos["player_0"]["forfeit"] and infos["player_1"]["forfeit"]


def test_pointers_name_steps_written_by_point(work: Path) -> None:
    run = work / "run"
    point(run, BEST, run / "checkpoints" / "step_000001")
    assert latest_checkpoint(run, BEST) == run / "checkpoints" / "step_000001"


def test_an_unknown_scripted_bot_is_refused_by_validate_and_train(tmp_path: Path) -> None:
    path = tmp_path / "team.yaml"
    path.write_text(
        "schema: marl-teams/v1\nname: s\nroles:\n"
        "  - {name: player, model: tiny-random, adapter: {r: 4, alpha: 8}}\n"
        "  - {name: bot, model: heuristc, backend: scripted}\n"
        "game: {name: kuhn_poker}\n" + "train:\n" + TRAIN
    )
    for args in (["validate", str(path)], ["train", str(path), "--out", str(tmp_path / "run")]):
        located(*cli(*args), "roles.1.model", "kuhn_poker has no bot 'heuristc'", "heuristic")
    assert not (tmp_path / "run").exists()


def test_marl_run_refuses_more_episodes_than_it_can_hold() -> None:
    code, output = cli("run", str(TINY), "--game", "plan_execute", "--episodes", "1000000000000")
    assert code == 2 and "100000" in output and "Traceback" not in output, output
