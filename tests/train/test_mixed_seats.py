"""Mixed seats: a team whose middle role is a frozen hosted model (backend openai, a real
``marl serve`` on 127.0.0.1 serving the tiny model) between two trainable local roles.  The
trainer trains the local roles only, and the hosted role's tokens (as its server counts them)
are part of what each task costs."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from helpers import ParityTask, Saying, register_parity_task, team_train
from marl.agents.openai_backend import EndpointError
from marl.config import load_config_text
from marl.orchestrator.serving.serve import TeamServer, make_server
from marl.orchestrator.team import Team, TeamError
from marl.train.trainer import Trainer

register_parity_task("mixed_parity", first="planner", answerer="executor")


SERVED = """\
schema: marl-teams/v1
name: hosted-tiny
roles:
  - name: answerer
    model: tiny-random
    decoding: {mode: free, temperature: 0.0, max_new_tokens: 3}
game: {name: plan_execute}
"""


def mixed_yaml(base_url: str) -> str:
    local = (
        "    model: tiny-random\n    adapter: {r: 4, alpha: 8}\n"
        "    decoding: {mode: free, temperature: 1.0, max_new_tokens: 3}\n"
    )
    return f"""\
schema: marl-teams/v1
name: mixed
roles:
  - name: planner
{local}  - name: advisor
    model: hosted-tiny
    backend: openai
    endpoint: {{base_url: "{base_url}"}}
    decoding: {{mode: free, max_new_tokens: 3}}
  - name: executor
{local}topology: {{kind: chain, final: executor}}
game: {{name: mixed_parity}}
{team_train(checkpoint_every=1000)}"""


@pytest.fixture(scope="module")
def server() -> Iterator[TeamServer]:
    with make_server(Team.from_config(load_config_text(SERVED)), port=0) as srv:
        yield srv


def test_only_local_roles_train_and_hosted_tokens_count(server: TeamServer, tmp_path: Path) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    tr = Trainer(load_config_text(mixed_yaml(server.url)), tmp_path / "run")
    assert set(tr.runtime.weights()) == {"planner", "executor"}  # the hosted role has none
    before = {
        role: {k: v.clone() for k, v in sd.items()} for role, sd in tr.runtime.weights().items()
    }
    trained: list[str] = []
    update = tr.runtime.update

    def spy(items, seed, lr):  # noqa: ANN001, ANN202 - records what the learners get
        trained.extend(item.adapter for batch in items.values() for item in batch)
        return update(items, seed, lr)

    tr.runtime.update = spy  # type: ignore[method-assign]
    for _ in range(2):
        res = tr.train_step()
        for ep in res.episodes:
            advisor = [t for t in ep.turns if t.role == "advisor"]
            assert advisor and all(not t.completion_ids for t in advisor)  # nothing to learn
            local = sum(
                len(t.prompt_ids) + len(t.completion_ids) for t in ep.turns if t.role != "advisor"
            )
            assert ep.tokens > local  # + the hosted turn's prompt and completion tokens
        tokens = res.metrics["topology"]["tokens_per_task"]
        assert tokens == pytest.approx(sum(ep.tokens for ep in res.episodes) / len(res.episodes))
    assert trained and set(trained) <= {"planner", "executor"}
    after = tr.runtime.weights()
    for role in ("planner", "executor"):
        assert any(not torch.equal(before[role][k], after[role][k]) for k in after[role])


def test_hosted_tokens_are_the_servers_count(server: TeamServer) -> None:
    team = Team.from_config(load_config_text(mixed_yaml(server.url)))
    res = team.run("What is 2 + 3?")
    advisor = next(t for t in res.transcript if t.role == "advisor")
    assert advisor.prompt_tokens > 0 and advisor.completion_tokens > 0
    assert res.tokens == sum(t.prompt_tokens + t.completion_tokens for t in res.transcript)


def test_a_dead_endpoint_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    tr = Trainer(load_config_text(mixed_yaml(url)), tmp_path / "run")
    with pytest.raises(EndpointError, match=f"{url}/chat/completions failed after 3 tries"):
        tr.train_step()


def test_a_hosted_expert_answers_a_deferred_task(server: TeamServer) -> None:
    cfg = load_config_text(
        mixed_yaml(server.url).replace(
            "  - name: advisor",
            "    defer: {expert: openai, cost: 0.2, model: hosted-tiny, endpoint: "
            f'{{base_url: "{server.url}"}}}}\n  - name: advisor',
            1,
        )
    )
    team = Team.from_config(
        cfg, policies={"planner": Saying("DEFER"), "advisor": Saying("-"), "executor": Saying("-")}
    )
    res = team.run(
        ParityTask(
            0, game="mixed_parity", answerer="executor", private_views={"planner": "You start."}
        )
    )
    assert res.expert is not None and res.answer == res.expert.text
    assert res.expert.prompt_tokens > 0 and res.expert.completion_tokens > 0
    assert res.tokens == res.expert.prompt_tokens + res.expert.completion_tokens  # + 0 scripted
    assert res.reward == pytest.approx(res.score - 0.2)
    with pytest.raises(TeamError, match="experts for advisor"):
        Team.from_config(
            cfg,
            policies={"planner": Saying("DEFER")},
            experts={"advisor": team.defer["planner"][1]},
        )
