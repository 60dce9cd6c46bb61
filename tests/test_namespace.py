"""One installed namespace: a user's project with its own ``games/``, ``agents/`` and
``configs/`` packages, and the OpenAI Agents SDK (``import agents``) in the same environment,
run an entry-point game and embed a team without a clash."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

PLUGINS = Path(__file__).parent / "plugins"

TEAM = """\
schema: marl-teams/v1
name: own-game
roles:
  - name: player
    count: 2
    model: tiny-random
    adapter: {r: 4, alpha: 8}
    decoding: {mode: choice}
game: {entry_point: "games.mine:closest_number"}
"""

#: An application in the user's folder: its own packages and marl's side by side.
APP = """\
import agents, configs, games.mine
from marl.orchestrator import Team, play
from marl.games import make_from_config
from marl.config import GameConfig, load_config

assert agents.OWN and configs.OWN and games.OWN
env = make_from_config(GameConfig(entry_point="games.mine:closest_number"))
team = Team.from_config(load_config("team.yaml"))
print("ok", type(env).__name__, team.name)
"""

#: An OpenAI Agents SDK application that calls a marl team from a function tool.
SDK_APP = """\
import agents
from agents import Agent, function_tool
from marl.orchestrator import Team
from marl.config import load_config

assert not hasattr(agents, "OWN")  # the SDK, not a folder of the user's
team = Team.from_config(load_config("{team}"))


@function_tool
def ask_team(question: str) -> str:
    "Ask the marl team."
    return team.run(question).answer


assistant = Agent(name="front", instructions="Ask the team.", tools=[ask_team])
print("ok", assistant.tools[0].name, type(team.run("2 + 2?").answer).__name__)
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """A process started in ``cwd`` as a user would start it (nothing of ours on PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A user's folder with packages named like ours: ``games`` (an env), ``agents``,
    ``configs``."""
    for name in ("games", "agents", "configs"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("OWN = True\n")
    (tmp_path / "games" / "mine.py").write_text((PLUGINS / "pz_games.py").read_text())
    (tmp_path / "team.yaml").write_text(TEAM)
    return tmp_path


def test_a_users_own_games_package_serves_an_entry_point(project: Path) -> None:
    marl = [sys.executable, "-m", "marl"]
    done = _run([*marl, "validate", "team.yaml"], project)
    assert done.returncode == 0, done.stdout + done.stderr
    done = _run([*marl, "play", "team.yaml", "--episodes", "2", "--out", "out"], project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "player_0" in done.stdout


def test_an_app_with_its_own_packages_embeds_a_team(project: Path) -> None:
    (project / "app.py").write_text(APP)
    done = _run([sys.executable, "app.py"], project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok ") and done.stdout.split()[-1] == "own-game"


def test_the_openai_agents_sdk_lives_beside_marl(tmp_path: Path) -> None:
    pytest.importorskip("agents.tool", reason="the OpenAI Agents SDK (dev extra openai-agents)")
    team = REPO / "configs" / "solver_critic_judge.yaml"
    cfg = team.read_text().replace("smollm2-135m-instruct", "tiny-random")
    cfg = re.sub(r"max_new_tokens: \d+", "max_new_tokens: 4", cfg)
    (tmp_path / "team.yaml").write_text(cfg)
    (tmp_path / "sdk_app.py").write_text(SDK_APP.format(team=tmp_path / "team.yaml"))
    done = _run([sys.executable, "sdk_app.py"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["ok", "ask_team", "str"]
