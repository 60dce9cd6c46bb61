"""Tournaments end to end: the tic-tac-toe bot ranking, resume after SIGKILL, Swiss pairing,
Ray actors, model, checkpoint and HTTP participants, the report files and the CLI's errors."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from helpers import RECIPES
from marl.agents.builder import build_roster
from marl.cli import app
from marl.config import load_config
from marl.config.tournament import TournamentConfig
from marl.orchestrator.arena.report import RATING_COLUMNS
from marl.orchestrator.arena.tournament import (
    MATCHES,
    MatchPlayer,
    MatchRecord,
    Tournament,
    TournamentError,
    run_tournament,
    swiss_pairs,
    swiss_round,
)
from marl.orchestrator.serving.serve import make_server
from marl.orchestrator.team import Team

REPO = Path(__file__).parents[3]
TINY = REPO / "configs" / "tiny_test.yaml"


def tournament(tmp_path: Path, body: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text("schema: marl-teams/tournament/v1\nname: t\n" + body)
    return path


def bots_body(game: str = "tic_tac_toe", per: int = 20, extra: str = "") -> str:
    return (
        f"game: {{name: {game}}}\nparticipants:\n  - {{name: random, source: random}}\n"
        "  - {name: heuristic, source: heuristic}\n  - {name: optimal, source: optimal}\n"
        f"games_per_pairing: {per}\nanchor: optimal\nbootstrap: 20\n{extra}"
    )


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def lines_of(path: Path) -> list[str]:
    data = path.read_text()
    return data[: data.rfind("\n") + 1].splitlines()


def test_tictactoe_bots_rank_optimal_heuristic_random(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = cli(
        "tournament", str(REPO / "configs" / "tournament_tictactoe.yaml"), "--out", str(out)
    )
    assert code == 0, output
    with (out / "ratings.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == RATING_COLUMNS
    assert [r["name"] for r in rows] == ["optimal", "heuristic", "random"]
    opt, heu, rnd = ({k: float(v) for k, v in r.items() if k != "name"} for r in rows)
    assert opt["rating"] == opt["ci_low"] == opt["ci_high"] == 0.0  # the anchor
    assert heu["ci_high"] < opt["ci_low"] and rnd["ci_high"] < heu["ci_low"]  # no overlap
    assert opt["losses"] == 0 and opt["games"] == heu["games"] == rnd["games"] == 800
    for r in (opt, heu, rnd):
        assert r["wins"] + r["draws"] + r["losses"] == r["games"]
    with (out / "payoff.csv").open() as f:
        payoff = {row[0]: row[1:] for row in list(csv.reader(f))[1:]}
    names = ["random", "heuristic", "optimal"]
    for i, a in enumerate(names):  # a zero-sum score matrix: M + M^T = 1 off the diagonal
        for j, b in enumerate(names):
            if i == j:
                assert payoff[a][j] == ""
            else:
                assert float(payoff[a][j]) + float(payoff[b][i]) == pytest.approx(1.0, abs=2e-4)
    assert float(payoff["optimal"][0]) > 0.9 and float(payoff["optimal"][1]) > 0.5
    seeds = {r["key"]: r["seed"] for r in map(json.loads, lines_of(out / MATCHES))}
    assert len(seeds) == 1200 and len(set(seeds.values())) == 600  # duplicate format:
    assert seeds["r0:random|optimal#7"] == seeds["r0:optimal|random#7"]  # same deal both ways
    page = (out / "report.html").read_text()
    assert 'src="ratings.png"' in page and 'src="payoff.png"' in page
    assert (out / "ratings.png").stat().st_size > 1000 and (out / "payoff.png").exists()
    assert "optimal" in output and "1200 games (0 read back" in output


def test_resume_after_sigkill_replays_no_finished_game(tmp_path: Path) -> None:
    cfg = tournament(tmp_path, bots_body(per=600, extra="concurrency: 8\n"))
    out = tmp_path / "out"
    matches = out / MATCHES
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "marl", "tournament", str(cfg), "--out", str(out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    try:
        while not (matches.exists() and len(lines_of(matches)) >= 50):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no games written"
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    before = lines_of(matches)
    assert 50 <= len(before) < 1800, "the kill should land mid-tournament"
    with matches.open("a") as f:  # a torn last line, as a kill in the middle of a write leaves
        f.write('{"key": "r0:random|heur')
    code, output = cli("tournament", str(cfg), "--out", str(out))
    assert code == 0, output
    after = lines_of(matches)
    assert after[: len(before)] == before  # finished games kept as they were
    keys = [json.loads(line)["key"] for line in after]
    assert len(keys) == len(set(keys)) == 1800  # none twice, none missing
    assert f"1800 games ({len(before)} read back" in output
    assert f"{1800 - len(before)} played" in output


def record(round_: int, a: str, b: str, ra: float) -> MatchRecord:
    return MatchRecord(
        f"r{round_}:{a}|{b}#0",
        round_,
        [a, b],
        0,
        0,
        {"p0": a, "p1": b},
        {"p0": ra, "p1": -ra},
        5,
        0,
        0,
        0.0,
    )


def test_swiss_pairs_by_score_without_repeats() -> None:
    names = ["A", "B", "C", "D"]
    assert swiss_round(names, [], 0) == ([("A", "B"), ("C", "D")], None)
    r0 = [record(0, "A", "B", 1.0), record(0, "C", "D", -1.0)]  # A and D win
    assert swiss_round(names, r0, 1) == ([("A", "D"), ("B", "C")], None)  # winners meet
    r1 = r0 + [record(1, "A", "D", 1.0), record(1, "B", "C", 0.0)]
    pairs, _ = swiss_round(names, r1, 2)  # A-C and B-D are the only pairs not yet met
    assert sorted(map(frozenset, pairs), key=sorted) == [{"A", "C"}, {"B", "D"}]
    # when every opponent has been met, repeats are allowed rather than leaving anyone out
    met = {frozenset(p) for p in [("A", "B"), ("A", "C"), ("A", "D")]}
    assert swiss_pairs(["A", "B", "C", "D"], met) == [("A", "B"), ("C", "D")]


def test_swiss_odd_field_gives_each_bye_once(tmp_path: Path) -> None:
    five = ["random", "heuristic", "optimal", "heuristic", "random"]
    body = (
        "game: {name: tic_tac_toe}\nparticipants:\n"
        + "".join(f"  - {{name: p{i}, source: {b}}}\n" for i, b in enumerate(five))
        + "schedule: {kind: swiss, rounds: 3}\ngames_per_pairing: 2\nbootstrap: 0\n"
    )
    cfg = load_config(tournament(tmp_path, body), TournamentConfig)
    assert len(cfg.participants) == 5
    result = run_tournament(cfg, tmp_path / "out")
    assert len(result.records) == 3 * 2 * 2
    pairs_by_round: dict[int, set[frozenset[str]]] = {}
    for rec in result.records:
        pairs_by_round.setdefault(rec.round, set()).add(frozenset(rec.order))
    assert sorted(pairs_by_round) == [0, 1, 2]
    every = [p for r in pairs_by_round.values() for p in r]
    assert len(every) == len(set(every)) == 6  # two pairings a round, never repeated
    byes = [set(cfg.names()) - set().union(*r) for r in pairs_by_round.values()]
    assert all(len(b) == 1 for b in byes) and len(set().union(*byes)) == 3
    # the first round pairs in config order, later rounds by score: a rerun plays nothing
    again = run_tournament(cfg, tmp_path / "out")
    assert again.played == 0 and again.resumed == 12


def test_ray_actors_play_the_same_games(tmp_path: Path) -> None:
    local = run_tournament(
        load_config(tournament(tmp_path, bots_body()), TournamentConfig), tmp_path / "local"
    )
    cfg = load_config(
        tournament(
            tmp_path,
            bots_body(
                extra=("concurrency: 8\nray: {enabled: true, workers: 2, cpus_per_worker: 0.5}\n")
            ),
            "ray.yaml",
        ),
        TournamentConfig,
    )
    (tmp_path / "empty").mkdir()
    hollow = load_config(
        tournament(
            tmp_path,
            bots_body(extra="ray: {enabled: true, workers: 1, cpus_per_worker: 0.5}\n").replace(
                "source: heuristic", "source: empty"
            ),
            "hollow.yaml",
        ),
        TournamentConfig,
    )
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_tournament(cfg, tmp_path / "ray")
        with pytest.raises(TournamentError) as err:  # a participant an actor cannot load
            run_tournament(hollow, tmp_path / "hollow", base=tmp_path)
    finally:
        ray.shutdown()
    assert str(err.value).startswith("participant 'heuristic': ")
    assert str(err.value).endswith(
        "has no team.yaml (expected a run, checkpoint or exported team folder)"
    )

    def games(result) -> dict[str, tuple]:
        return {
            r.key: (r.seed, tuple(r.seats.items()), tuple(r.returns.items()))
            for r in result.records
        }

    assert len(remote.records) == 60
    assert games(remote) == games(local)  # bots draw from per-game seeds: same games


def test_model_checkpoint_and_bot_participants_share_one_model(tmp_path: Path) -> None:
    roster = build_roster(load_config(TINY))
    ckpt = tmp_path / "ck"
    next(iter(roster.hosts.values())).save_adapter("player", ckpt / "adapters" / "player")
    (ckpt / "team.yaml").write_text(TINY.read_text())
    body = (
        "game: {name: kuhn_poker}\nparticipants:\n  - {name: nash, source: optimal}\n"
        f"  - {{name: initial, source: {TINY}}}\n  - {{name: trained, source: {ckpt}}}\n"
        "games_per_pairing: 4\nbootstrap: 10\nanchor: nash\n"
    )
    cfg = load_config(tournament(tmp_path, body), TournamentConfig)
    player = MatchPlayer(cfg.model_dump(by_alias=True), str(tmp_path))
    assert player.agents["initial"].policy.host is player.agents["trained"].policy.host
    assert player.agents["trained"].policy.adapter == "trained@player"
    result = run_tournament(cfg, tmp_path / "out")
    assert len(result.records) == 12
    assert {r.name: r.games for r in result.ratings} == {"nash": 8, "initial": 8, "trained": 8}


def test_http_participant_through_an_openai_compatible_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team_cfg = load_config(TINY)
    team_cfg = team_cfg.model_copy(
        update={
            "roles": [
                team_cfg.roles[0].model_copy(
                    update={
                        "count": 1,
                        "adapter": None,
                        "decoding": team_cfg.roles[0].decoding.model_copy(
                            update={"mode": "free", "max_new_tokens": 4, "temperature": 0.0}
                        ),
                    }
                )
            ]
        }
    )
    server = make_server(Team.from_config(team_cfg), port=0, api_key="sk-test")
    server.start()
    monkeypatch.setenv("TEST_KEY", "sk-test")
    body = (
        "game: {name: kuhn_poker}\nparticipants:\n  - {name: random, source: random}\n"
        f"  - name: served\n    http: {{model: tiny-test, endpoint: {{base_url: "
        f"'{server.url}', api_key_env: TEST_KEY}}, decoding: {{max_new_tokens: 4}}}}\n"
        "games_per_pairing: 4\nbootstrap: 0\n"
    )
    try:
        result = run_tournament(
            load_config(tournament(tmp_path, body), TournamentConfig), tmp_path / "out"
        )
    finally:
        server.stop()
    assert len(result.records) == 4
    served_turns = sum(r.turns for r in result.records)
    assert served_turns > 4
    # the tiny random model writes no [Action]: every served move is an unparsed one
    assert sum(r.parse_errors for r in result.records) > 0


def test_cli_reports_bad_configs_and_participants_without_traceback(tmp_path: Path) -> None:
    missing = tournament(tmp_path, bots_body().replace("source: heuristic", "source: nope"))
    code, output = cli("tournament", str(missing), "--out", str(tmp_path / "o1"))
    assert code == 2 and "Traceback" not in output
    assert f"{missing}:6:31: participants.1.source: neither a bot of tic_tac_toe" in output
    odd = tournament(tmp_path, bots_body(per=3), "odd.yaml")
    code, output = cli("tournament", str(odd), "--out", str(tmp_path / "o2"))
    assert code == 2 and "games_per_pairing: tic_tac_toe has 2 seats" in output
    (tmp_path / "empty").mkdir()
    hollow = tournament(
        tmp_path, bots_body().replace("source: heuristic", "source: empty"), "hollow.yaml"
    )
    code, output = cli("tournament", str(hollow), "--out", str(tmp_path / "o3"))
    assert code == 2 and "Traceback" not in output
    assert "error: participant 'heuristic':" in output and "has no team.yaml" in output
    good = tournament(tmp_path, bots_body(per=2), "good.yaml")
    assert cli("tournament", str(good), "--out", str(tmp_path / "o4"))[0] == 0
    other = tournament(tmp_path, bots_body(per=4), "other.yaml")
    code, output = cli("tournament", str(other), "--out", str(tmp_path / "o4"))
    assert code == 2 and "holds games of another tournament (games_per_pairing" in output


def test_examples_validate_and_schema_is_current(tmp_path: Path) -> None:
    for name in ("tournament_tictactoe.yaml", "tournament_kuhn.yaml"):
        path = RECIPES / name
        cfg = load_config(path, TournamentConfig)
        Tournament(cfg, tmp_path / name, base=path.parent)  # sources resolve
    kuhn = load_config(RECIPES / "tournament_kuhn.yaml", TournamentConfig)
    assert [p.source for p in kuhn.participants] == [
        "random",
        "heuristic",
        "optimal",
        "kuhn_selfplay.yaml",
    ]
    code, output = cli("schema", "--tournament")
    committed = (REPO / "docs" / "tournament.schema.json").read_text(encoding="utf-8")
    assert code == 0 and output == committed, (
        "docs/tournament.schema.json is stale: run "
        "`marl schema --tournament --out docs/tournament.schema.json`"
    )
    assert json.loads(committed)["properties"]["schema"]["const"] == "marl-teams/tournament/v1"


def tiny_run(tmp_path: Path, step: int = 2) -> Path:
    """A run folder holding one checkpoint of the tiny model, ``best`` and ``latest`` on it."""
    from marl.infra.layout import BEST, LATEST, METRICS, adapter_folder, checkpoint_dir, point

    run = tmp_path / "run"
    ckpt = checkpoint_dir(run, step)
    roster = build_roster(load_config(TINY))
    next(iter(roster.hosts.values())).save_adapter("player", adapter_folder(ckpt, "player"))
    (ckpt / "team.yaml").write_text(TINY.read_text())
    (run / METRICS).write_text("")
    for pointer in (BEST, LATEST):
        point(run, pointer, ckpt)
    return run


def test_kuhn_chips_ratings_put_no_one_above_the_nash_bot(tmp_path: Path) -> None:
    """In expectation an equilibrium player loses to nobody: rated by chips against the
    field's Nash mixture, no player is above the Nash (optimal) bot beyond the intervals,
    although against the field an exploiter (heuristic, which milks random harder) leads."""
    run = tiny_run(tmp_path)
    body = (
        "game: {name: kuhn_poker}\nparticipants:\n  - {name: random, source: random}\n"
        "  - {name: heuristic, source: heuristic}\n  - {name: nash, source: optimal}\n"
        f"  - {{name: trained, source: {run}/best}}\ngames_per_pairing: 300\n"
        "bootstrap: 200\nanchor: random\n"
    )
    out = tmp_path / "out"
    code, output = cli("tournament", str(tournament(tmp_path, body)), "--out", str(out))
    assert code == 0, output
    with (out / "ratings.csv").open() as f:
        rows = {
            r["name"]: {k: (v if k == "name" else float(v)) for k, v in r.items()}
            for r in csv.DictReader(f)
        }
    nash = rows["nash"]
    for r in rows.values():
        assert r["return_low"] <= r["mean_return"] <= r["return_high"]
        assert r["nash_low"] <= r["nash_average"] <= r["nash_high"] <= 1e-9  # value 0
        assert r["nash_low"] <= nash["nash_high"], (r, nash)  # nobody above, beyond the CIs
    assert nash["mean_return"] > 0 > rows["random"]["mean_return"]
    assert rows["random"]["nash_high"] < nash["nash_low"]  # the loser is told apart
    page = (out / "report.html").read_text()
    assert f"trained = {run}/best -&gt; step_000002" in page  # which checkpoint best named
    assert "ranked by the Nash average" in page
