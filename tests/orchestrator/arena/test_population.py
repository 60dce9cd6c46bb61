"""The population meta-strategy: mixtures of table policies, their exact exploitability and
the least exploitable mixture, checked against mixtures worked out by hand on Kuhn poker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from marl.games.analysis import exploitability, game_tree
from marl.games.cfr import run_cfr
from marl.games.population import least_exploitable_mixture, mixture_exploitability, mixture_policy

GAME = "kuhn_poker"
CHECK, BET, CALL, FOLD = 0, 1, 2, 3


def pure(**moves: int) -> dict[str, dict[int, float]]:
    """A pure Kuhn strategy for both seats: ``J_`` is the key ``J:``, ``Q_cb`` is ``Q:cb``."""
    table = {}
    for name, action in moves.items():
        key = name.replace("_", ":")
        legal = [CHECK, BET] if key[-1] in ":c" else [CALL, FOLD]
        table[key] = {a: float(a == action) for a in legal}
    return table


# Two pure strategies that differ only where the Nash profile (alpha = 0) mixes 1/3 : 2/3:
# player 0 calls a bet with the queen, player 1 bets the jack after a check and calls a bet
# with the queen.  Every such state is reached by both members, so the (1/3, 2/3) mixture is
# that Nash profile.
SHARED = dict(
    J_=CHECK, Q_=CHECK, K_=CHECK, J_cb=FOLD, K_cb=CALL, J_b=FOLD, K_b=CALL, K_c=BET, Q_c=CHECK
)
A = pure(**SHARED, Q_cb=CALL, J_c=BET, Q_b=CALL)
B = pure(**SHARED, Q_cb=FOLD, J_c=CHECK, Q_b=FOLD)


def table(sigma) -> dict[str, dict[int, float]]:
    """A slot vector as a table."""
    tree = game_tree(GAME)
    return {
        key: {a: float(sigma[tree.slot_start[i] + j]) for j, a in enumerate(acts)}
        for i, (key, acts) in enumerate(zip(tree.infoset_keys, tree.infoset_actions, strict=True))
    }


def test_two_pure_strategies_mix_to_the_nash_profile() -> None:
    assert exploitability(GAME, A) > 0.1 and exploitability(GAME, B) > 0.1
    assert mixture_exploitability(GAME, [A, B], [1 / 3, 2 / 3]) == pytest.approx(0, abs=1e-12)
    mixed = mixture_policy(GAME, [A, B], [1, 2])  # weights are normalised
    assert mixed["Q:cb"][CALL] == pytest.approx(1 / 3)
    assert mixed["J:c"][BET] == pytest.approx(1 / 3)
    solution = least_exploitable_mixture(GAME, [A, B], tol=1e-4)
    assert solution.weights == pytest.approx([1 / 3, 2 / 3], abs=1e-3)
    assert solution.exploitability <= 1e-4
    assert solution.lower_bound <= solution.exploitability


def test_the_mixture_weights_each_member_by_its_own_reach() -> None:
    # C bets the jack (and would fold it after check-bet), D checks it and calls: only D
    # reaches J:cb, so the mixture calls there for sure, not half the time.
    c = pure(**{**SHARED, "J_": BET}, Q_cb=CALL, J_c=BET, Q_b=CALL)
    d = pure(**{**SHARED, "J_cb": CALL}, Q_cb=CALL, J_c=BET, Q_b=CALL)
    mixed = mixture_policy(GAME, [c, d], [0.5, 0.5])
    assert mixed["J:"][BET] == pytest.approx(0.5)
    assert mixed["J:cb"] == {CALL: 1.0, FOLD: 0.0}
    assert mixed["K:cb"] == {CALL: 1.0, FOLD: 0.0}  # where both agree, they agree


def test_a_member_repeated_is_that_member() -> None:
    member = table(run_cfr(game_tree(GAME), 3))
    mixed = mixture_policy(GAME, [member] * 3, [1, 1, 1])
    for key, row in member.items():
        assert mixed[key] == pytest.approx(row)
    assert mixture_exploitability(GAME, [member] * 3, [1, 1, 1]) == pytest.approx(
        exploitability(GAME, member)
    )
    solution = least_exploitable_mixture(GAME, [member] * 3)
    assert solution.exploitability == pytest.approx(exploitability(GAME, member), abs=1e-9)


def test_cfr_iterates_as_a_population_beat_their_best_member_and_cfrs_average() -> None:
    tree = game_tree(GAME)
    iterates: list = []
    average = run_cfr(tree, 10, on_iterate=iterates.append)
    members = [table(s) for s in iterates]
    best = min(exploitability(GAME, m) for m in members)
    solution = least_exploitable_mixture(GAME, members, tol=1e-4)
    assert solution.exploitability <= 0.01 < best
    assert solution.exploitability < exploitability(GAME, table(average))
    assert solution.exploitability - solution.lower_bound <= 1e-4 + 1e-12
    assert sum(solution.weights) == pytest.approx(1.0)


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        mixture_policy(GAME, [A, B], [1.0, -0.5])
    with pytest.raises(ValueError, match="empty"):
        least_exploitable_mixture(GAME, [])


# ----- a run's snapshots on the tiny model

TINY = Path(__file__).parents[3] / "configs" / "tiny_test.yaml"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three steps with a league: checkpoints at steps 2 and 3; the snapshot of step 1 lives
    only inside them."""
    from marl.config import load_config_text
    from marl.train.trainer import Trainer

    text = TINY.read_text() + (
        "train: {steps: 3, group_size: 2, groups_per_step: 2, checkpoint_every: 2,\n"
        "        league: {opponents: league, snapshot_every: 1}, ray: {enabled: false}}\n"
    )
    run = tmp_path_factory.mktemp("pop") / "run"
    Trainer(load_config_text(text), run).fit()
    return run


def test_eval_population_writes_a_mixture_no_worse_than_its_best_member(tiny_run: Path) -> None:
    from typer.testing import CliRunner

    from marl.agents.population import run_members
    from marl.cli import app

    names = [m.name for m in run_members(tiny_run)]
    assert names == ["step_000002", "step_000003", "snap_1"]
    result = CliRunner().invoke(app, ["eval", "population", str(tiny_run)])
    assert result.exit_code == 0, result.output
    assert "mixture exploitability" in result.output
    data = json.loads((tiny_run / "population.json").read_text())
    assert data["game"] == GAME
    assert [m["name"] for m in data["members"]] == names
    assert sum(m["weight"] for m in data["members"]) == pytest.approx(1.0)
    assert data["lower_bound"] <= data["exploitability"]
    assert data["exploitability"] <= data["best_member"]["exploitability"] + 1e-12
    assert data["best_member"]["exploitability"] == min(
        m["exploitability"] for m in data["members"]
    )


def test_a_snapshot_member_plays_the_snapshots_weights(tiny_run: Path) -> None:
    from safetensors.torch import load_file

    from marl.agents.participants import ParticipantLoader
    from marl.agents.population import load_member, run_members
    from marl.infra.layout import snapshot_file

    snap = next(m for m in run_members(tiny_run) if m.snapshot == "snap:1")
    agent = load_member(ParticipantLoader(GAME), tiny_run, snap, "s")
    saved = load_file(str(snapshot_file(tiny_run / "checkpoints" / snap.checkpoint, "snap:1")))
    loaded = agent.policy.host.adapter_weights(agent.policy.adapter)
    assert {f"player::{k}" for k in loaded} == set(saved)
    for k, v in loaded.items():
        assert torch.equal(v, saved[f"player::{k}"])


def test_the_population_participant_draws_one_member_per_game(
    tiny_run: Path, tmp_path: Path
) -> None:
    from marl.config import load_config
    from marl.config.tournament import TournamentConfig
    from marl.orchestrator.arena.tournament import MatchPlayer, run_tournament

    population = tiny_run / "population.json"
    data = {
        "game": GAME,
        "members": [
            {"name": "step_000002", "checkpoint": "step_000002", "snapshot": None, "weight": 0.5},
            {"name": "snap_1", "checkpoint": "step_000002", "snapshot": "snap:1", "weight": 0.5},
            {"name": "step_000003", "checkpoint": "step_000003", "snapshot": None, "weight": 0.0},
        ],
    }
    population.write_text(json.dumps(data))
    body = (
        "schema: marl-teams/tournament/v1\nname: t\ngame: {name: kuhn_poker}\n"
        f"participants:\n  - {{name: pop, source: {population}}}\n"
        "  - {name: random, source: random}\ngames_per_pairing: 8\nbootstrap: 10\n"
    )
    (tmp_path / "t.yaml").write_text(body)
    cfg = load_config(tmp_path / "t.yaml", TournamentConfig)
    player = MatchPlayer(cfg.model_dump(by_alias=True), str(tmp_path))
    members = player.agents["pop"].policy.members
    assert [m.name for m in members] == ["pop/step_000002", "pop/snap_1"]  # weight 0: not loaded
    adapters = {
        s: {player._seat("pop", seat, s).policy.adapter for seat in ("player_0", "player_1")}
        for s in range(40)
    }
    assert all(len(a) == 1 for a in adapters.values())  # both seat orders: the same member
    assert {a for drawn in adapters.values() for a in drawn} == {m.policy.adapter for m in members}
    assert adapters == {
        s: {player._seat("pop", "player_0", s).policy.adapter} for s in range(40)
    }  # the draw is the game seed's
    assert player._seat("pop", "player_0", 3).name == "pop"
    result = run_tournament(cfg, tmp_path / "out")
    assert len(result.records) == 8
    assert all("pop" in r.seats.values() for r in result.records)
