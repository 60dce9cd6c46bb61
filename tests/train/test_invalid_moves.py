"""train.invalid_moves: what an unplayable free-text answer does in training (the game's
forfeit, a retry with the error shown, or a random legal move and a format penalty)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import tiny_smoke, tiny_team
from marl import games
from marl.agents.agent import Agent
from marl.agents.policy import Request, Response
from marl.agents.rollout import RolloutEngine, retry_request
from marl.config import load_config_text
from marl.config.train import InvalidMovesConfig
from marl.orchestrator.arena.play import PlayReport
from marl.train.trainer import Trainer


class Stubborn:
    """Answers nonsense, unless the chat shows it an error: then the first legal move."""

    def __init__(self) -> None:
        self.seen: list[Request] = []

    def act(self, requests: list[Request]) -> list[Response]:
        self.seen += requests
        return [
            Response(
                text=r.action_texts[0]
                if "cannot be played" in r.messages[-1]["content"]
                else "I have no idea"
            )
            for r in requests
        ]


def _play(handling: str, **kw) -> tuple[list, Stubborn]:
    policy = Stubborn()
    seats = {
        s: Agent(s, "player", policy, "", "free") for s in games.make("kuhn_poker").possible_agents
    }
    engine = RolloutEngine(
        lambda: games.make("kuhn_poker"),
        lambda i: seats,
        invalid=InvalidMovesConfig(handling=handling, **kw),
    )
    return engine.play(4), policy


def test_forfeit_is_the_game_rule_and_no_penalty() -> None:
    episodes, _ = _play("forfeit")
    for ep in episodes:
        assert len(ep.turns) == 1 and ep.forfeits == ["player_0"]
        assert ep.turns[0].format_reward == 0.0 and not ep.turns[0].parsed


def test_retry_asks_again_with_the_answer_and_the_error() -> None:
    episodes, policy = _play("retry", penalty=0.25, retries=1)
    for ep in episodes:
        assert not ep.forfeits
        first, second = ep.turns[0], ep.turns[1]
        assert first.agent == second.agent == "player_0"
        assert not first.parsed and first.format_reward == -0.25
        assert second.parsed and second.legal and second.format_reward == 0.0
        assert [t.parsed for t in ep.turns] == [False, True] * (len(ep.turns) // 2)
    retried = [r for r in policy.seen if len(r.messages) == 3]
    assert retried and retried[0].messages[1] == {"role": "assistant", "content": "I have no idea"}
    assert "no action found" in retried[0].messages[2]["content"]


def test_a_retry_states_a_long_move_family_as_its_rule() -> None:
    game = games.make("negotiation")
    game.reset(seed=0)
    agent = game.agent_selection
    request = Agent(agent, "player", Stubborn(), "", "free").request(game, agent)
    asked = retry_request(request, "I have no idea", "no action found").messages[-1]["content"]
    assert asked.endswith(f"ending with one of: {game.legal_text(agent)}")
    assert game.legal_text(agent).startswith("[propose n1 n2 n3] with n1 from 0 to")
    assert "[propose 0 0 0]" not in asked  # not the list of every split
    kuhn = games.make("kuhn_poker")
    kuhn.reset(seed=0)
    request = Agent("p", "player", Stubborn(), "", "free").request(kuhn, kuhn.agent_selection)
    asked = retry_request(request, "?", "no action found").messages[-1]["content"]
    assert asked.endswith("ending with one of: [Check] [Bet]")


def test_retry_forfeits_once_the_retries_are_spent() -> None:
    class Hopeless(Stubborn):
        def act(self, requests):
            self.seen += requests
            return [Response(text="still no idea") for _ in requests]

    policy = Hopeless()
    seats = {s: Agent(s, "player", policy, "", "free") for s in ("player_0", "player_1")}
    engine = RolloutEngine(
        lambda: games.make("kuhn_poker"),
        lambda i: seats,
        invalid=InvalidMovesConfig(handling="retry", retries=2),
    )
    (ep,) = engine.play(1)
    assert len(ep.turns) == 3 and ep.forfeits == ["player_0"]
    assert all(t.format_reward == -0.5 for t in ep.turns)


def test_penalty_plays_a_random_legal_move_and_keeps_the_game_returns_apart() -> None:
    episodes, _ = _play("penalty", penalty=0.5)
    for ep in episodes:
        assert not ep.forfeits and sum(ep.returns.values()) == 0  # the game's own payoffs
        for t in ep.turns:
            assert not t.parsed and not t.legal and t.action is not None  # legal: no forfeit
            assert t.format_reward == -0.5


class Fixated:
    """Names the first move it was ever shown, long after that cell is taken."""

    def __init__(self) -> None:
        self.move: str | None = None

    def act(self, requests: list[Request]) -> list[Response]:
        self.move = self.move or requests[0].action_texts[0]
        return [Response(text=self.move) for _ in requests]


def test_penalty_keeps_an_illegal_answer_counted_as_illegal() -> None:
    """The substituted move is played; the turn still says the answer was illegal, so the
    play report and the trainer's ``illegal_move_rate`` count it."""
    policy = Fixated()
    seats = {
        s: Agent(s, "player", policy, "", "free") for s in games.make("tic_tac_toe").possible_agents
    }
    engine = RolloutEngine(
        lambda: games.make("tic_tac_toe"),
        lambda i: seats,
        invalid=InvalidMovesConfig(handling="penalty", penalty=0.5),
    )
    (ep,) = engine.play(1)
    first, *rest = ep.turns
    assert first.parsed and first.legal and first.format_reward == 0.0
    assert rest and all(t.parsed and not t.legal and t.format_reward == -0.5 for t in rest)
    assert len({t.action for t in ep.turns}) == len(ep.turns) and not ep.forfeits
    report = PlayReport()
    report.add(ep, {"player_0", "player_1"})
    assert report.illegal_moves == len(rest) and report.parse_errors == 0


def _free_team(handling: str) -> str:
    train = (
        "  steps: 1\n  group_size: 2\n  groups_per_step: 2\n  checkpoint_every: 100\n"
        "  ray: {enabled: false}\n"
        f"  invalid_moves: {{handling: {handling}, penalty: 0.5, retries: 1}}\n"
    )
    return tiny_team("kuhn_poker", train).replace(
        "decoding: {mode: choice}", "decoding: {mode: free, max_new_tokens: 6}"
    )


@pytest.mark.parametrize("handling", ["forfeit", "retry", "penalty"])
def test_training_step_on_the_tiny_model(tmp_path: Path, handling: str) -> None:
    """The untrained tiny model writes nonsense: every handling trains a step, and the
    trainer's reward of a turn is the game's return plus its format reward."""
    trainer = Trainer(load_config_text(_free_team(handling)), tmp_path / "run")
    res = trainer.train_step()
    m = res.metrics
    assert m["parse_error_rate"] > 0.5
    penalised = [t for ep in res.episodes for t in ep.turns if t.format_reward]
    assert m["format_penalties"] == len(penalised)
    turns = [t for ep in res.episodes for t in ep.turns]
    assert m["illegal_move_rate"] == pytest.approx(
        sum(t.parsed and not t.legal for t in turns) / len(turns)
    )
    if handling == "forfeit":
        assert not penalised
    else:
        assert penalised and all(t.format_reward == -0.5 for t in penalised)
    if handling == "penalty":
        assert not any(ep.forfeits for ep in res.episodes)
    rows, samples = trainer.samples(res.episodes, trainer.plan(1))
    for (ep, t), r in zip(rows, samples.rewards, strict=True):
        assert r == pytest.approx(ep.returns[t.agent] + t.format_reward)


def test_the_shipped_free_text_config_trains_on_the_tiny_model(tmp_path: Path) -> None:
    cfg = tiny_smoke("configs/kuhn_freetext.yaml")
    assert cfg.train.invalid_moves.handling == "retry"
    hist = Trainer(cfg, tmp_path / "run").fit()
    assert len(hist) == 2 and hist[0]["format_penalties"] > 0
