"""Do the words matter: a think policy's table read with the move scored after its own
reasoning, an empty one or one from another information state (the tiny model), the
derangement that swaps them, and the whole-word matcher of the cards a reasoning names."""

from __future__ import annotations

import pytest

from helpers import build_tiny_host
from marl import games
from marl.agents.agent import Agent
from marl.agents.hf_policy import HFPolicy
from marl.agents.host import ModelHost
from marl.agents.host.generation import THINK_SEPARATOR
from marl.agents.mentions import named, naming_shares
from marl.agents.reasoning import (
    derangements,
    mode_report,
    reasoning_reports,
    sample_reasonings,
)
from marl.agents.tables import agent_report

KUHN = games.make("kuhn_poker").private_names()


def test_kuhn_exposes_its_cards_and_the_card_held() -> None:
    assert KUHN == {"J": ("Jack", "J"), "Q": ("Queen", "Q"), "K": ("King", "K")}
    env = games.make("leduc_poker")
    env.reset(seed=1)
    held = env.information_state("player_0")[0]
    assert env.private_value("player_0") == held
    assert games.make("tic_tac_toe").private_names() == {}


@pytest.mark.parametrize(
    ("text", "cards"),
    [
        ("I hold the King, so I bet.", {"K"}),
        ("king beats queen", {"K", "Q"}),
        ("Kings and JACKS", {"K", "J"}),
        ("My card: [K]. Their Q is weaker.", {"K", "Q"}),
        ("K:cb means I checked", {"K"}),
        ("J-high, fold", {"J"}),
        ("OK, I check. Kingdom of jackals, queenly.", set()),
        ("k and q in lower case are no cards; neither is QK", set()),
        ("", set()),
    ],
)
def test_the_matcher_finds_whole_words_only(text: str, cards: set[str]) -> None:
    assert named(text, KUHN) == cards


def test_naming_shares_count_own_and_other_cards_per_reasoning() -> None:
    scored = [("I have the King", "K"), ("a Jack or a King?", "K"), ("check", "Q"), ("Q", "J")]
    shares = naming_shares(scored, KUHN)
    assert shares is not None and shares.texts == 4
    assert shares.own == pytest.approx(2 / 4) and shares.other == pytest.approx(2 / 4)
    assert naming_shares(scored, {}) is None and naming_shares([], KUHN) is None


def test_derangements_keep_each_player_and_no_state_its_own() -> None:
    players = ["a", "a", "b", "a", "b", "b", "a"]
    maps = derangements(players, 50, seed=3)
    assert maps == derangements(players, 50, seed=3)  # seeded
    for src in maps:
        assert sorted(src) == list(range(len(players)))  # a permutation
        assert all(s != i and players[s] == players[i] for i, s in enumerate(src))
    assert len({tuple(m) for m in maps}) > 1  # a fresh one per draw
    with pytest.raises(ValueError, match="two information states per player"):
        derangements(["a", "a", "b"], 1)


@pytest.fixture(scope="module")
def host() -> ModelHost:
    return build_tiny_host("red", perturb=True)


def _agent(host: ModelHost, mode: str = "think", tokens: int = 3) -> Agent:
    policy = HFPolicy(
        host, "red", mode=mode, temperature=1.5, think_tokens=tokens, think_prompt="Think.", seed=3
    )
    return Agent("p", "player", policy, "You play poker.", mode)


def test_own_empty_and_swap_tables_and_their_sources(host: ModelHost) -> None:
    own, empty, swap = reasoning_reports(_agent(host), "kuhn_poker", ["own", "empty", "swap"], 3)
    direct = agent_report(_agent(host), "kuhn_poker", samples=3)  # the same seeds
    assert own.report.exploitability == pytest.approx(direct.exploitability, abs=1e-9)
    assert own.report.interval == pytest.approx(direct.interval, abs=1e-9)
    keys = set(direct.table)
    player = {key: len(key.split(":")[1]) % 2 for key in keys}  # Kuhn: who acts there
    for r in (own, empty, swap):
        assert set(r.report.table) == keys == set(r.transcripts)
        assert all(sum(row.values()) == pytest.approx(1.0) for row in r.report.table.values())
    assert empty.report.interval is None and empty.shares is None  # one context a state
    assert swap.report.interval is not None and swap.report.samples == 3
    for key in keys:
        assert [t.source for t in own.transcripts[key]] == [key] * 3
        assert [(t.source, t.text) for t in empty.transcripts[key]] == [(None, "")]
        sources = [t.source for t in swap.transcripts[key]]
        assert len(sources) == 3 and key not in sources
        assert all(player[s] == player[key] for s in sources)
    for r in (own, swap):
        assert r.shares is not None and r.shares.texts == 3 * len(keys)


def test_empty_and_swap_score_the_contexts_specified(host: ModelHost, monkeypatch) -> None:
    """empty: the think prompt, then the separator; own: the state's reasoning (its end of
    sequence dropped) between them; swap: another state's reasoning there."""
    agent = _agent(host)
    policy = agent.policy
    reasonings = sample_reasonings(agent, "kuhn_poker", 2)
    prompts = policy._prompts(reasonings.requests)[0]
    sep, eos = host.text_ids(THINK_SEPARATOR), host.tokenizer.eos_token_id
    seen: list[list[int]] = []
    scores = host.move_scores
    monkeypatch.setattr(
        host, "move_scores", lambda ps, xs, cs: seen.extend(xs) or scores(ps, xs, cs)
    )
    n = len(prompts)
    mode_report(agent, reasonings, "empty", 2)
    assert seen == [p + sep for p in prompts]
    for mode in ("own", "swap"):
        seen.clear()
        report = mode_report(agent, reasonings, mode, 2)
        assert len(seen) == 2 * n
        for k, (key, context) in enumerate(zip(reasonings.keys * 2, seen, strict=True)):
            i, j = reasonings.keys.index(key), k // n
            source = reasonings.keys.index(report.transcripts[key][j].source)
            assert (source == i) == (mode == "own")
            ids = reasonings.ids[source][j]
            assert context == prompts[i] + (ids[:-1] if ids[-1:] == [eos] else ids) + sep


def test_a_policy_that_writes_no_reasoning_is_refused(host: ModelHost) -> None:
    for agent in (_agent(host, "choice"), _agent(host, tokens=0)):
        with pytest.raises(TypeError, match="writes no reasoning"):
            reasoning_reports(agent, "kuhn_poker", ["own"], 2)
