"""Deferring a task to an expert: the ``defer`` schema, the hand-over in the team runtime
(oracle, a person through stdin), the reward it earns, and a short GRPO run on the tiny model
where the deferral rate rises when deferring is cheap and falls when it costs more than a
right answer is worth."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from helpers import Saying
from marl.config import ConfigError, load_config_text
from marl.games.tasks import make_task
from marl.orchestrator.arena.credit import Accuracy
from marl.orchestrator.team import EXPERT_NODE, Team, TeamError
from marl.train.trainer import Trainer

#: The tiny random model speaks bytes and cannot spell DEFER; about half of its first bytes are
#: not ASCII and decode to U+FFFD, so that is the defer token its policy can learn to emit.
NON_ASCII = "\\ufffd"
#: The planner's LoRA includes the (tied) lm_head: the tiny model's next-byte distribution is
#: near uniform and barely moves through q/v alone.  peft warns about the tied layer.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:peft")


def team_yaml(
    defer: str = f'{{expert: oracle, cost: 0.25, token: "{NON_ASCII}"}}',
    train: str = "",
    lr: float = 0.03,
) -> str:
    return f"""\
schema: marl-teams/v1
name: deferring
roles:
  - name: planner
    model: tiny-random
    adapter: {{r: 4, alpha: 8, targets: [q_proj, v_proj, lm_head]}}
    decoding: {{mode: free, temperature: 1.0, max_new_tokens: 1}}
    defer: {defer}
  - name: executor
    model: tiny-random
    decoding: {{mode: free, temperature: 1.0, max_new_tokens: 1}}
topology: {{kind: chain, final: executor}}
game: {{name: plan_execute}}
train:
  rollout: team
  reward: team
  agent_key: role
  group_size: 8
  groups_per_step: 8
  lr: {lr}
  checkpoint_every: 1000
  ray: {{enabled: false}}
{train}"""


def problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    return [(p.path, p.message) for p in info.value.problems]


# ----- the schema
@pytest.mark.parametrize(
    ("defer", "path", "words"),
    [
        ("{expert: wizard, cost: 0.1}", "roles.0.defer.expert", "oracle"),
        ("{expert: hf, cost: 0.1}", "roles.0.defer.expert", "human"),  # not a frozen expert
        ("{expert: oracle, cost: -0.1}", "roles.0.defer.cost", "greater than or equal"),
        ("{expert: oracle, cost: 1000}", "roles.0.defer.cost", "less than or equal"),
        ("{expert: oracle}", "roles.0.defer.cost", "required"),
        ("{expert: oracle, cost: 0.1, token: 'two words'}", "roles.0.defer.token", "pattern"),
        ("{expert: openai, cost: 0.1, model: m}", "roles.0.defer.endpoint", "required"),
        ("{expert: oracle, cost: 0.1, model: m}", "roles.0.defer.model", "only allowed"),
    ],
)
def test_defer_config_errors_are_located(defer: str, path: str, words: str) -> None:
    found = problems(team_yaml(defer))
    assert any(p == path and words in m for p, m in found), found


def test_only_a_local_role_may_defer() -> None:
    text = team_yaml().replace(
        "    model: tiny-random\n    adapter: {r: 4, alpha: 8, targets: [q_proj, v_proj, "
        "lm_head]}\n",
        "    model: m\n    backend: openai\n    endpoint: {base_url: 'http://127.0.0.1:9/v1'}\n",
        1,
    )
    assert any(
        p == "roles.0.defer" and "cannot learn when to defer" in m for p, m in problems(text)
    )


def test_defer_needs_a_team_task() -> None:
    with pytest.raises(ConfigError, match="only a team task"):
        load_config_text(team_yaml(train="  steps: 1\n").replace("rollout: team", "rollout: game"))


# ----- the hand-over
def scripted_team(planner: str, defer: str | None = None) -> Team:
    cfg = load_config_text(team_yaml(defer or "{expert: oracle, cost: 0.25, token: DEFER}"))
    return Team.from_config(
        cfg, policies={"planner": Saying(planner), "executor": Saying("\\boxed{-1}")}
    )


def test_a_deferring_answer_goes_to_the_oracle_at_a_cost() -> None:
    task = make_task("plan_execute", 3)
    res = scripted_team("I DEFER to the expert").run(task)
    assert res.deferrals == 1 and res.decided_by == EXPERT_NODE
    assert res.answer == f"\\boxed{{{task.answer}}}" and res.score == 1.0
    assert res.reward == pytest.approx(1 - 0.25)
    assert [t.agent for t in res.transcript] == ["planner"]  # the executor never spoke
    assert res.expert is not None and res.messages == 0


def test_a_non_deferring_answer_is_scored_as_before() -> None:
    task = make_task("plan_execute", 3)
    res = scripted_team(f"PLAN: {task.plan}").run(task)
    assert res.deferrals == 0 and res.expert is None and res.decided_by == "executor@0"
    assert res.answer == "\\boxed{-1}" and res.score == 0.0 and res.reward == 0.0
    assert [t.agent for t in res.transcript] == ["planner", "executor"]


def test_the_human_expert_answers_through_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    task = make_task("plan_execute", 5)
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{task.answer}\n"))
    team = scripted_team("DEFER", "{expert: human, cost: 0.5, token: DEFER}")
    res = team.run(task)
    assert res.decided_by == EXPERT_NODE and res.answer == str(task.answer)
    assert res.score == 1.0 and res.reward == pytest.approx(0.5)


# ----- learning the decision
def deferral_rates(cost: float, run: Path, seed: int, steps: int = 8) -> list[float]:
    defer = f'{{expert: oracle, cost: {cost}, token: "{NON_ASCII}"}}'
    cfg = load_config_text(team_yaml(defer, f"  steps: {steps}\n  seed: {seed}\n"))
    tr = Trainer(cfg, run)
    return [tr.train_step().metrics["deferral_rate"] for _ in range(steps)]


@pytest.mark.parametrize("seed", [0, 1])
def test_cheap_deferral_is_learned(seed: int, tmp_path: Path) -> None:
    rates = deferral_rates(0.1, tmp_path / "run", seed)
    # the untrained planner defers about half the time; the oracle is right, its answer
    # earns 0.9 against 0 for the planner's own
    assert 0.3 <= rates[0] <= 0.7
    assert sum(rates[-2:]) / 2 >= 0.8, rates


@pytest.mark.parametrize("seed", [0, 1])
def test_deferral_costing_more_than_a_right_answer_is_unlearned(seed: int, tmp_path: Path) -> None:
    rates = deferral_rates(1.5, tmp_path / "run", seed)
    assert 0.3 <= rates[0] <= 0.7
    assert sum(rates[-2:]) / 2 <= 0.2, rates


def test_the_evaluation_reports_the_deferral_rate() -> None:
    tasks = [make_task("plan_execute", s) for s in range(4)]
    deferred = scripted_team("DEFER").run_batch(tasks)
    answered = scripted_team("PLAN: 1 + 1").run_batch(tasks)
    acc = Accuracy.of(deferred[:1] + answered[1:])
    assert acc.deferral_rate == 0.25 and acc.accuracy == 0.25  # the oracle was right


def test_the_deferral_rate_is_in_metrics_jsonl(tmp_path: Path) -> None:
    cfg = load_config_text(team_yaml(train="  steps: 1\n"))
    Trainer(cfg, tmp_path / "run").fit()
    (line,) = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    m = json.loads(line)
    assert 0 < m["deferral_rate"] < 1
    topo = m["topology"]
    assert topo["reward"] == pytest.approx(topo["score"] - 0.25 * m["deferral_rate"])


def test_the_expert_message_and_the_langgraph_refusal() -> None:
    team = scripted_team("DEFER")
    res = team.run(make_task("plan_execute", 1))
    assert res.expert is not None
    assert (res.expert.agent, res.expert.round, res.expert.reads) == (EXPERT_NODE, 0, [])
    assert res.to_dict()["expert"]["text"] == res.answer
    with pytest.raises(TeamError, match="planner may defer"):
        team.to_langgraph()


def test_marl_eval_team_shows_the_deferral_rate(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from marl.cli import app

    cfg = load_config_text(team_yaml(train="  steps: 1\n"))
    Trainer(cfg, tmp_path / "run").fit()
    r = CliRunner(env={"COLUMNS": "200"}).invoke(
        app,
        [
            "eval",
            "team",
            str(tmp_path / "run"),
            "--tasks",
            "8",
            "--temperature",
            "1.0",
            "--out",
            str(tmp_path / "credit"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "deferred" in r.output
    rows = json.loads((tmp_path / "credit" / "credit.json").read_text())
    assert any(row["deferral_rate"] > 0 for row in rows["rows"])
