"""Every command that takes a trained team accepts the five ways of naming one: RUN (its
latest checkpoint), RUN/best, RUN/latest, a checkpoint folder and an exported team."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import tiny_team
from marl.cli import app
from marl.config import load_config_text

FORMS = ["run", "run/best", "run/latest", "run/checkpoints/step_000001", "export"]
TINY = Path(__file__).parents[2] / "configs" / "tiny_test.yaml"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``run`` (two evaluated steps, a checkpoint each, so ``best`` exists)
    and ``export`` (its team exported)."""
    from marl.train.trainer import Trainer

    root = tmp_path_factory.mktemp("forms")
    Trainer(
        load_config_text(
            tiny_team(
                "kuhn_poker",
                "  steps: 2\n  eval_every: 1\n  groups_per_step: 1\n  group_size: 2\n"
                "  checkpoint_every: 1\n  ray: {enabled: false}\n",
            )
        ),
        root / "run",
    ).fit()
    assert (root / "run" / "best").is_file()
    result = CliRunner().invoke(app, ["export", str(root / "run"), "--out", str(root / "export")])
    assert result.exit_code == 0, result.output
    return root


def ok(*args: str, stdin: str | None = None) -> str:
    result = CliRunner().invoke(app, list(args), input=stdin)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.output


@pytest.mark.parametrize("form", FORMS)
def test_play_against(trained: Path, form: str, tmp_path: Path) -> None:
    out = ok(
        "play",
        str(TINY),
        "--against",
        str(trained / form),
        "--episodes",
        "2",
        "--out",
        str(tmp_path),
    )
    assert "parse errors" in out
    assert len((tmp_path / "transcripts.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("form", FORMS)
def test_play_human_against(trained: Path, form: str, tmp_path: Path) -> None:
    out = ok(
        "play",
        str(TINY),
        "--human",
        "--against",
        str(trained / form),
        "--episodes",
        "1",
        "--seat",
        "player_1",
        "--out",
        str(tmp_path),
        stdin="1\n1\n",
    )
    assert "opponent (" in out and "1 game(s)" in out.split("summary")[-1]


@pytest.mark.parametrize("form", FORMS)
def test_tournament_source(trained: Path, form: str, tmp_path: Path) -> None:
    spec = tmp_path / "t.yaml"
    spec.write_text(
        "schema: marl-teams/tournament/v1\nname: t\ngame: {name: kuhn_poker}\n"
        "participants:\n  - {name: random, source: random}\n"
        f"  - {{name: trained, source: {json.dumps(str(trained / form))}}}\n"
        "games_per_pairing: 2\nanchor: random\nbootstrap: 5\n"
    )
    out = ok("tournament", str(spec), "--out", str(tmp_path / "out"))
    assert "trained" in out


@pytest.mark.parametrize("form", FORMS)
def test_eval_exploitability(trained: Path, form: str) -> None:
    assert "exploitability:" in ok("eval", "exploitability", str(trained / form))


@pytest.mark.parametrize("form", FORMS)
def test_export(trained: Path, form: str, tmp_path: Path) -> None:
    out = ok("export", str(trained / form), "--out", str(tmp_path / "again"))
    assert "exported to" in out and (tmp_path / "again" / "team.yaml").is_file()


@pytest.mark.parametrize("form", FORMS)
def test_topology_show(trained: Path, form: str) -> None:
    assert "flowchart" in ok("topology", "show", str(trained / form))


@pytest.mark.parametrize("form", FORMS)
def test_serve_loads_the_team(trained: Path, form: str) -> None:
    """What ``marl serve`` loads before it binds a port."""
    from marl.cli.common import load_runtime_team

    team = load_runtime_team(str(trained / form))
    assert team.agents
