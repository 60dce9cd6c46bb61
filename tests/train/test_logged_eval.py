"""The exploitability a run logs is the one ``marl eval exploitability`` finds on the saved
checkpoint: both read the policy from a model stored as the run's team stores it (here a bf16
base, whose norms and residual stream compute in bf16: read from an fp32 copy of the same
weights the untrained SmolLM2 policy's exploitability moved from 0.40616 to 0.39824)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from marl.agents.participants import ParticipantLoader
from marl.agents.tables import agent_report
from marl.config import load_config
from marl.train.trainer import Trainer

TEAM = """\
schema: marl-teams/v1
name: t
roles:
  - name: player
    count: 2
    model: tiny-random
    adapter: {r: 4, alpha: 8}
    decoding: {mode: choice, temperature: 3.0, precision: bf16}
game: {name: kuhn_poker}
train:
  steps: 2
  group_size: 4
  groups_per_step: 4
  lr: 0.05
  eval_every: 1
  precision: bf16
  ray: {enabled: false}
"""


@pytest.mark.filterwarnings("ignore:precision bf16 on a CPU")
def test_logged_exploitability_equals_the_saved_checkpoints(tmp_path: Path) -> None:
    team = tmp_path / "team.yaml"
    team.write_text(TEAM)
    run = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(load_config(team), run).fit()
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in logged if "eval" in m][-1]
    assert last["step"] == 2
    agent = ParticipantLoader("kuhn_poker").load(str(run))
    again = agent_report(agent, "kuhn_poker").exploitability
    assert again == pytest.approx(last["eval"]["exploitability"], abs=1e-9)
    untrained = agent_report(ParticipantLoader("kuhn_poker").load(str(team)), "kuhn_poker")
    assert untrained.exploitability != pytest.approx(again, abs=1e-6)  # the run moved it
