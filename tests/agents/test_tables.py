"""Exact evaluation of bots and model checkpoints through `marl eval exploitability`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marl.agents.builder import build_roster
from marl.agents.tables import agent_probs, table_policy
from marl.cli import app
from marl.config import load_config
from marl.games.analysis import info_states

TINY = Path(__file__).parents[2] / "configs" / "tiny_test.yaml"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_cfr_bot_is_unexploitable_and_random_is_eleven_24ths(tmp_path: Path) -> None:
    code, _ = run(
        "eval",
        "exploitability",
        "optimal",
        "--game",
        "kuhn_poker",
        "--out",
        str(tmp_path / "cfr.json"),
    )
    assert code == 0
    assert json.loads((tmp_path / "cfr.json").read_text())["exploitability"] <= 1e-3
    code, _ = run("eval", "exploitability", "random", "--out", str(tmp_path / "r.json"))
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and report["exploitability"] == pytest.approx(11 / 24, abs=1e-12)
    assert len(report["table"]) == 12


def test_model_table_covers_every_information_state_and_matches_play() -> None:
    roster = build_roster(load_config(TINY))
    agent = roster.agents[0]
    table = table_policy(agent_probs(agent, batch=5), "kuhn_poker")
    assert sorted(table) == sorted(k for k, _, _ in info_states("kuhn_poker"))
    for key, _, legal in info_states("kuhn_poker"):
        assert sorted(table[key]) == legal
        assert sum(table[key].values()) == pytest.approx(1.0)


def test_checkpoint_folder_and_bad_targets(tmp_path: Path) -> None:
    roster = build_roster(load_config(TINY))
    ckpt = tmp_path / "ck"
    next(iter(roster.hosts.values())).save_adapter("player", ckpt / "adapters" / "player")
    (ckpt / "team.yaml").write_text(TINY.read_text())
    code, out = run("eval", "exploitability", str(ckpt), "--out", str(tmp_path / "c.json"))
    assert code == 0, out
    assert 0 < json.loads((tmp_path / "c.json").read_text())["exploitability"] < 2
    code, out = run("eval", "exploitability", "random", "--game", "tic_tac_toe")
    assert code == 2 and "exact tree" in out
    code, out = run("eval", "exploitability", str(tmp_path / "missing"))
    assert code == 2 and "neither a bot" in out


def test_training_logs_exploitability_from_the_untrained_policy_on(tmp_path: Path) -> None:
    from marl.config import load_config_text
    from marl.train.trainer import Trainer

    text = TINY.read_text() + (
        "train: {steps: 2, group_size: 2, groups_per_step: 2, "
        "eval_every: 2, ray: {enabled: false}}\n"
    )
    Trainer(load_config_text(text), tmp_path / "run").fit()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(ln) for ln in lines]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "eval" in rows[0] and "eval" not in rows[1] and "eval" in rows[2]
    assert 0 < rows[0]["eval"]["exploitability"] < 2


def test_a_sampled_table_averages_each_states_own_draws() -> None:
    """Every information state's K draws, and only its own, make its mean: draws that
    alternate around a per-state value give that value exactly."""
    from marl.agents.tables import sampled_report
    from marl.games.analysis import info_state_envs

    keys = sorted(info_state_envs("kuhn_poker"))
    value = {k: 0.1 + 0.05 * i for i, k in enumerate(keys)}
    seen: dict[str, int] = {}

    def read(positions: list) -> list[dict]:
        out = []
        for env, who in positions:
            text = env.text_observation(who)
            key = next(k for k, (e, w) in state_envs.items() if e.text_observation(w) == text)
            seen[key] = seen.get(key, 0) + 1
            x = value[key] + (0.05 if seen[key] % 2 else -0.05)
            first, second = env.legal_actions(who)
            out.append({first: x, second: 1 - x})
        return out

    state_envs = info_state_envs("kuhn_poker")
    report = sampled_report(read, "kuhn_poker", samples=4, resamples=5)
    assert set(seen.values()) == {4}
    assert {k: min(row.items())[1] for k, row in report.table.items()} == pytest.approx(value)


def test_outcomes_against_a_bot_read_a_model_at_every_reachable_position(tmp_path: Path) -> None:
    """The tiny model on small Nim against random: the batched table gives what the model's
    own distribution, asked position by position inside the search, gives."""
    from marl.agents.tables import outcome_report
    from marl.games.bots import make_bot
    from marl.games.nim import Nim
    from marl.games.perfect_info import outcome_probabilities

    def small() -> Nim:
        return Nim(piles=(2, 3))

    agent = build_roster(load_config(TINY)).agents[0]
    rand = make_bot("nim", "random").action_probs
    report = outcome_report(agent_probs(agent, batch=7), small, rand)

    def asked(env, who) -> dict[int, float]:
        request = agent.request(env, who)
        return dict(zip(request.legal, agent.policy.probabilities([request])[0], strict=True))

    for seat in ("player_0", "player_1"):
        direct = outcome_probabilities(small, asked, seat, rand)
        assert report.seats[seat] == pytest.approx(direct, abs=1e-6)
        assert sum(report.seats[seat].values()) == pytest.approx(1.0)
        assert 0 < report.seats[seat]["win"] < 1
    assert report.positions["player_0"] > 1


def test_eval_against_from_the_cli(tmp_path: Path) -> None:
    code, out = run("eval", "against", "heuristic", "--out", str(tmp_path / "h.json"))
    assert code == 0, out
    report = json.loads((tmp_path / "h.json").read_text())
    assert report["seats"]["player_0"]["loss"] == 0.0
    assert report["positions"] == {"player_0": 2423, "player_1": 2097}
    both = sum(s["win"] + s["draw"] for s in report["seats"].values()) / 2
    assert report["win_draw"] == pytest.approx(both) and 0.95 < both < 1
    code, out = run("eval", "against", "random", "--game", "kuhn_poker")
    assert code == 2 and "perfect-information" in out
    code, out = run("eval", "against", "random", "--bot", "nosuch")
    assert code == 2 and "no bot 'nosuch'" in out
