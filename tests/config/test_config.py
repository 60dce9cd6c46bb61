"""The config system: schema rules, FILE:LINE:COL locations, env interpolation, the CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel, Field, ValidationError
from typer.testing import CliRunner

from helpers import RECIPES, recipes
from marl import config as configs
from marl.cli import app
from marl.config import (
    ConfigError,
    Problem,
    TeamConfig,
    load_config,
    load_config_text,
    validate_file,
)

REPO = Path(__file__).resolve().parents[2]

# Line numbers in the tests below refer to this text (line 1 is "schema: ...").
BASE = """\
schema: marl-teams/v1
name: t
roles:
  - name: a
    model: tiny-random
  - name: b
    model: tiny-random
    decoding:
      temperature: 0.5
game:
  name: kuhn_poker
"""


def write(tmp_path: Path, text: str, name: str = "team.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def problems(tmp_path: Path, text: str, **kw) -> list[str]:
    return [str(p) for p in validate_file(write(tmp_path, text), **kw)]


def edit(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


#: BASE with something for a train section to train: role a has an adapter (one line more).
TRAINED = edit(
    "    model: tiny-random\n  - name: b", "    model: tiny-random\n    adapter: {}\n  - name: b"
)


# --- valid files and defaults ---


def test_base_loads_with_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE))
    assert isinstance(cfg, TeamConfig)
    assert cfg.schema_version == "marl-teams/v1"
    assert [r.name for r in cfg.roles] == ["a", "b"]
    a = cfg.role("a")
    assert (a.count, a.backend, a.adapter, a.share_base_with) == (1, "hf", None, None)
    assert (
        a.decoding.mode,
        a.decoding.temperature,
        a.decoding.max_new_tokens,
        a.decoding.top_p,
    ) == ("free", 1.0, 64, 1.0)
    assert cfg.role("b").decoding.temperature == 0.5
    assert (cfg.topology.kind, cfg.topology.rounds, cfg.topology.learnable) == ("chain", 1, False)
    assert cfg.game.kwargs == {}
    assert configs.RoleConfig(name="x").model == "smollm2-135m-instruct"
    with pytest.raises(KeyError, match="known roles: a, b"):
        cfg.role("c")


def test_adapter_defaults_and_null_means_frozen(tmp_path: Path) -> None:
    text = edit(
        "    model: tiny-random\n  - name: b",
        "    model: tiny-random\n    adapter: {}\n  - name: b",
    )
    text = edit("      temperature: 0.5\n", "      temperature: 0.5\n    adapter: null\n", text)
    cfg = load_config(write(tmp_path, text))
    lora = cfg.role("a").adapter
    assert lora is not None
    assert (lora.r, lora.alpha, lora.dropout, lora.targets) == (8, 16, 0.0, ["q_proj", "v_proj"])
    assert cfg.role("b").adapter is None


def test_every_example_config_validates() -> None:
    files = recipes()
    names = {p.name for p in files}
    assert {"kuhn_selfplay.yaml", "tictactoe_selfplay.yaml", "tiny_test.yaml"} <= names
    for path in files:
        assert validate_file(path) == [], path


def test_example_games_are_registered() -> None:
    """The CLI also checks game names against the registry: every example passes it."""
    files = [str(p) for p in recipes()]
    result = CliRunner().invoke(app, ["validate", *files])
    assert result.exit_code == 0, result.output
    assert result.output.count(": ok") == len(files)


def test_examples_say_what_the_brief_says() -> None:
    kuhn = load_config(RECIPES / "kuhn_selfplay.yaml")
    (player,) = kuhn.roles
    assert (player.name, player.count, player.model) == ("player", 2, "smollm2-135m-instruct")
    assert player.adapter is not None and player.decoding.mode == "choice"
    assert kuhn.game.name == "kuhn_poker"
    assert load_config(RECIPES / "tiny_test.yaml").roles[0].model == "tiny-random"


# --- locations of each kind of error ---


def test_wrong_type_points_at_the_value(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, edit("temperature: 0.5", "temperature: hot")) == [
        f"{f}:9:20: roles.1.decoding.temperature: input should be a valid number, "
        "unable to parse string as a number, got 'hot'"
    ]


def test_out_of_range_and_bad_literal(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    text = edit("      temperature: 0.5\n", "      temperature: -1\n      mode: greedy\n")
    assert problems(tmp_path, text) == [
        f"{f}:9:20: roles.1.decoding.temperature: input should be greater than or equal to 0, "
        "got -1",
        f"{f}:10:13: roles.1.decoding.mode: input should be 'free', 'choice' or 'think', "
        "got 'greedy'",
    ]


def test_unknown_key_points_at_the_key_with_a_hint(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, edit("temperature: 0.5", "temprature: 0.5")) == [
        f"{f}:9:7: roles.1.decoding.temprature: unknown key 'temprature'; "
        "did you mean 'temperature'?"
    ]
    # No close match: list what is allowed at that level instead.
    assert problems(tmp_path, BASE + "zzz: 1\n") == [
        f"{f}:12:1: zzz: unknown key 'zzz'; allowed keys: schema, name, description, roles, "
        "topology, game, train"
    ]


def test_missing_fields_point_at_the_parent_mapping(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, edit("  - name: b\n    model", "  - model")) == [
        f"{f}:6:5: roles.1.name: missing required field 'name'"
    ]
    assert problems(tmp_path, edit("game:\n  name: kuhn_poker\n", "")) == [
        f"{f}:1:1: game: missing required field 'game'"
    ]
    assert problems(tmp_path, edit("schema: marl-teams/v1\n", "")) == [
        f"{f}:1:1: schema: missing required field 'schema' (add 'schema: marl-teams/v1')"
    ]


def test_wrong_schema_id(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, edit("marl-teams/v1", "marl-teams/v2")) == [
        f"{f}:1:9: schema: input should be 'marl-teams/v1', got 'marl-teams/v2'"
    ]


def test_bad_placeholders(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    text = edit(
        "    model: tiny-random\n  - name: b",
        "    model: tiny-random\n    system_prompt: 'You are {nmae}'\n"
        "    goal: 'win {'\n  - name: b",
    )
    assert problems(tmp_path, text) == [
        f"{f}:6:20: roles.0.system_prompt: unknown placeholder '{{nmae}}'; "
        "allowed: game, goal, index, name, role, team",
        f"{f}:7:11: roles.0.goal: malformed placeholder: Single '{{' encountered in format string "
        "(write '{{' or '}}' for a literal brace)",
    ]
    text = edit(
        "    model: tiny-random\n  - name: b",
        "    model: tiny-random\n    goal: '{goal} and {}'\n  - name: b",
    )
    (msg,) = problems(tmp_path, text)
    assert msg.startswith(f"{f}:6:11: roles.0.goal: unknown placeholder '{{goal}}'")
    ok = edit(
        "    model: tiny-random\n  - name: b",
        "    model: tiny-random\n    system_prompt: '{{literal}} {name} #{index:02d} {goal}'"
        "\n  - name: b",
    )
    assert problems(tmp_path, ok) == []


def test_positional_and_attribute_placeholders_rejected() -> None:
    with pytest.raises(ValidationError, match=r"positional placeholder '\{\}'"):
        configs.RoleConfig(name="x", goal="win {}")
    with pytest.raises(ValidationError, match=r"'\{role.upper\}' uses attribute or index"):
        configs.RoleConfig(name="x", goal="win as {role.upper}")
    with pytest.raises(ValidationError, match=r"nested placeholder"):
        configs.RoleConfig(name="x", goal="win as {role:{index}}")


def test_friendlier_messages_for_yaml_surprises(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, edit("name: t", "name: 2024-01-01")) == [
        f"{f}:2:7: name: input should be a valid string, got the date 2024-01-01 "
        "(quote it to make it a string)"
    ]
    short_edge = BASE + "topology: {kind: explicit, edges: [[a]]}\n"
    assert problems(tmp_path, short_edge) == [
        f"{f}:12:36: topology.edges.0.1: missing item 1 (too few items)"
    ]


def test_unknown_role_in_topology(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    star = BASE + "topology:\n  kind: star\n  hub: c\n"
    assert problems(tmp_path, star) == [
        f"{f}:14:8: topology.hub: unknown role 'c'; known roles: a, b"
    ]
    explicit = BASE + "topology:\n  kind: explicit\n  edges: [[a, b], [b, zed]]\n"
    assert problems(tmp_path, explicit) == [
        f"{f}:14:23: topology.edges.1.1: unknown role 'zed'; known roles: a, b"
    ]
    layered = BASE + "topology:\n  kind: layered\n  layers:\n    - [a]\n    - [b, a, q]\n"
    assert problems(tmp_path, layered) == [
        f"{f}:16:11: topology.layers.1.1: role 'a' is already in layer 0",
        f"{f}:16:14: topology.layers.1.2: unknown role 'q'; known roles: a, b",
    ]


def test_topology_kind_specific_fields(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, BASE + "topology:\n  kind: star\n") == [
        f"{f}:13:3: topology.hub: required when kind is 'star'"
    ]
    assert problems(tmp_path, BASE + "topology:\n  hub: a\n  layers: [[a]]\n") == [
        f"{f}:13:8: topology.hub: only allowed when kind is 'star' (kind is 'chain')",
        f"{f}:14:11: topology.layers: only allowed when kind is 'layered' (kind is 'chain')",
    ]
    assert problems(tmp_path, BASE + "topology:\n  kind: explicit\n  edges: [[a, a]]\n") == [
        f"{f}:14:11: topology.edges.0: self-loop 'a' -> 'a'"
    ]
    good = BASE + "topology:\n  kind: star\n  hub: b\n  rounds: 3\n  learnable: true\n"
    topo = load_config_text(good).topology
    assert (topo.kind, topo.hub, topo.rounds, topo.learnable) == ("star", "b", 3, True)


def test_duplicate_role_names(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, edit("  - name: b", "  - name: a")) == [
        f"{f}:6:11: roles.1.name: duplicate role name 'a' (also roles.0)"
    ]


def test_share_base_with(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    shared = edit("      temperature: 0.5\n", "      temperature: 0.5\n    share_base_with: a\n")
    assert load_config(write(tmp_path, shared)).role("b").share_base_with == "a"
    missing = edit("share_base_with: a", "share_base_with: nobody", shared)
    assert problems(tmp_path, missing) == [
        f"{f}:10:22: roles.1.share_base_with: unknown role 'nobody'; known roles: a, b"
    ]
    other_model = edit(
        "    model: tiny-random\n  - name: b", "    model: gpt2\n  - name: b", shared
    )
    assert problems(tmp_path, other_model) == [
        f"{f}:10:22: roles.1.share_base_with: role 'a' uses model 'gpt2' but this role uses "
        "'tiny-random'; sharing base weights needs the same model"
    ]
    cycle = edit(
        "    model: tiny-random\n  - name: b",
        "    model: tiny-random\n    share_base_with: b\n  - name: b",
        shared,
    )
    assert problems(tmp_path, cycle) == [
        f"{f}:6:22: roles.0.share_base_with: share_base_with forms a cycle: a -> b -> a",
        f"{f}:11:22: roles.1.share_base_with: share_base_with forms a cycle: b -> a -> b",
    ]


def test_adapter_needs_local_weights(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    text = edit(
        "    model: tiny-random\n  - name: b",
        "    model: optimal\n    backend: scripted\n    adapter: {r: 4}\n  - name: b",
    )
    assert problems(tmp_path, text) == [
        f"{f}:7:14: roles.0.adapter: backend 'scripted' has no local weights to train; "
        "remove the adapter or use backend 'hf'"
    ]


def test_openai_backend_needs_endpoint_and_free_decoding(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    text = edit(
        "    model: tiny-random\n  - name: b",
        "    model: gpt-4o-mini\n    backend: openai\n    decoding: {mode: choice}\n  - name: b",
    )
    assert problems(tmp_path, text) == [
        f"{f}:4:5: roles.0.endpoint: required when backend is 'openai'",
        f"{f}:7:22: roles.0.decoding.mode: the openai backend samples text and cannot score "
        "candidates; use mode 'free'",
    ]
    text = edit(
        "    model: tiny-random\n  - name: b",
        "    model: tiny-random\n    endpoint: {base_url: 'http://127.0.0.1:1/v1'}\n  - name: b",
    )
    assert problems(tmp_path, text) == [
        f"{f}:6:15: roles.0.endpoint: only allowed with backend 'openai' (backend is 'hf')"
    ]


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, BASE + "name: u\n") == [
        f"{f}:12:1: name: duplicate key 'name' (first at line 2)"
    ]


def test_anchors_and_merge_keys(tmp_path: Path) -> None:
    text = """\
    schema: marl-teams/v1
    name: t
    roles:
      - &base
        name: a
        model: tiny-random
        decoding: {mode: choice, temperature: 0.7}
      - <<: *base
        name: b
    game: {name: kuhn_poker}
    """
    cfg = load_config(write(tmp_path, text))
    assert [(r.name, r.model, r.decoding.temperature) for r in cfg.roles] == [
        ("a", "tiny-random", 0.7),
        ("b", "tiny-random", 0.7),
    ]


# --- environment interpolation ---

ENV_TEXT = edit(
    "    model: tiny-random\n  - name: b",
    "    model: ${ROLE_A_MODEL}\n    goal: 'reach ${GOAL_SCORE:-10} points'\n  - name: b",
)


def test_env_var_set(tmp_path: Path) -> None:
    env = {"ROLE_A_MODEL": "org/some-model", "GOAL_SCORE": "42"}
    a = load_config(write(tmp_path, ENV_TEXT), env=env).role("a")
    assert (a.model, a.goal) == ("org/some-model", "reach 42 points")


def test_env_var_default_and_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLE_A_MODEL", "from-os-environ")
    monkeypatch.delenv("GOAL_SCORE", raising=False)
    a = load_config(write(tmp_path, ENV_TEXT)).role("a")
    assert (a.model, a.goal) == ("from-os-environ", "reach 10 points")
    monkeypatch.setenv("GOAL_SCORE", "")  # like the shell, ":-" also covers an empty value
    assert load_config(write(tmp_path, ENV_TEXT)).role("a").goal == "reach 10 points"


def test_env_var_unset_is_a_located_problem(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, ENV_TEXT, env={}) == [
        f"{f}:5:12: roles.0.model: environment variable ROLE_A_MODEL is not set"
    ]


def test_env_numbers_coerce_and_escape(tmp_path: Path) -> None:
    text = edit("temperature: 0.5", "temperature: ${TEMP}")
    text = edit("name: t\n", "name: t\ndescription: 'costs $${HOME} and $$5'\n", text)
    cfg = load_config(write(tmp_path, text), env={"TEMP": "0.25"})
    assert cfg.role("b").decoding.temperature == 0.25
    assert cfg.description == "costs ${HOME} and $$5"
    f = str(tmp_path / "team.yaml")
    bad = edit("name: t\n", "name: ${1BAD}\n")
    assert problems(tmp_path, bad, env={}) == [
        f"{f}:2:7: name: malformed reference '${{1BAD}}'; use ${{NAME}} or ${{NAME:-default}}"
    ]


# --- file-level problems ---


def test_yaml_syntax_error_is_located(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    text = edit("  - name: b\n", "  - name: b\n   model: tiny-random\n")  # bad indent
    (msg,) = problems(tmp_path, text)
    assert msg.startswith(f"{f}:7:4: YAML syntax error: "), msg
    (msg,) = problems(tmp_path, "schema: marl-teams/v1\nname: [a, b\n")
    assert msg.startswith(f"{f}:3:1: YAML syntax error: "), msg


def test_file_level_problems(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    assert problems(tmp_path, "") == [
        f"{f}:1:1: the file is empty; a team file is a mapping that starts with "
        "'schema: marl-teams/v1'"
    ]
    assert problems(tmp_path, "# only a comment\n") == problems(tmp_path, "")
    assert problems(tmp_path, "- a\n- b\n") == [
        f"{f}:1:1: the top level must be a mapping of keys, got a list"
    ]
    assert problems(tmp_path, "just text\n") == [
        f"{f}:1:1: the top level must be a mapping of keys, got a str"
    ]
    assert problems(tmp_path, "a: 1\n---\nb: 2\n")[0].startswith(f"{f}:2:1: YAML syntax error")
    assert problems(tmp_path, "x: !!python/object:os.system {}\n")[0].startswith(
        f"{f}:1:4: YAML syntax error"
    )
    missing = tmp_path / "nope.yaml"
    assert [str(p) for p in validate_file(missing)] == [f"{missing}:1:1: no such file"]
    assert [str(p) for p in validate_file(tmp_path)] == [
        f"{tmp_path}:1:1: is a directory, not a YAML file"
    ]


def test_config_error_carries_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path, edit("temperature: 0.5", "temperature: hot\n      top_p: 0"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    err = info.value
    assert [(p.line, p.path) for p in err.problems] == [
        (9, "roles.1.decoding.temperature"),
        (10, "roles.1.decoding.top_p"),
    ]
    assert str(err) == "\n".join(str(p) for p in err.problems)
    assert isinstance(err.problems[0], Problem)
    assert str(Problem("f.yaml", 3, 4, "a.b", "bad")) == "f.yaml:3:4: a.b: bad"
    assert str(Problem("f.yaml", 1, 1, "", "empty")) == "f.yaml:1:1: empty"


# --- extension points ---


def test_checks_are_located(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")

    def no_poker(cfg: TeamConfig) -> list[tuple[tuple, str]]:
        return [(("game", "name"), "no poker today")] if "poker" in cfg.game.name else []

    assert problems(tmp_path, BASE, checks=[no_poker]) == [f"{f}:11:9: game.name: no poker today"]


class ExtraSection(BaseModel, extra="forbid"):
    steps: int = Field(10, ge=1)


class WithExtra(TeamConfig):
    """How a later issue adds a section: an optional field on a TeamConfig subclass."""

    extra: ExtraSection | None = None


def test_a_later_section_plugs_in(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    cfg = load_config(write(tmp_path, BASE + "extra:\n  steps: 3\n"), model=WithExtra)
    assert cfg.extra is not None and cfg.extra.steps == 3
    assert problems(tmp_path, BASE + "extra:\n  stpes: 3\n", model=WithExtra) == [
        f"{f}:13:3: extra.stpes: unknown key 'stpes'; did you mean 'steps'?"
    ]
    assert problems(tmp_path, BASE + "extra:\n  steps: 3\n")[0].startswith(
        f"{f}:12:1: extra: unknown key 'extra'"
    )


def test_train_section_is_validated_in_place(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    cfg = load_config(
        write(tmp_path, TRAINED + "train:\n  steps: 3\n  league: {anchors: [random]}\n")
    )
    assert cfg.train is not None and cfg.train.steps == 3
    assert cfg.train.league.anchors == ["random"]
    assert problems(tmp_path, TRAINED + "train:\n  group_size: 1\n  advantge: global\n") == [
        f"{f}:14:15: train.group_size: input should be greater than or equal to 2, got 1",
        f"{f}:15:3: train.advantge: unknown key 'advantge'; did you mean 'advantage'?",
    ]


def test_removed_settings_are_unknown_keys(tmp_path: Path) -> None:
    f = str(tmp_path / "team.yaml")
    (out,) = problems(tmp_path, TRAINED + "train:\n  algorithm: grpo\n")
    assert out.startswith(f"{f}:14:3: train.algorithm: unknown key 'algorithm'; allowed keys: ")


# --- the CLI ---


def test_cli_prints_exactly_one_line_per_problem(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
    schema: marl-teams/v1
    name: broken
    roles:
      - name: a
        count: many
        decodng: {}
    game: {}
    """,
    )
    result = CliRunner().invoke(app, ["validate", path])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.output.splitlines() == [
        f"{path}:5:12: roles.0.count: input should be a valid integer, unable to parse string "
        "as an integer, got 'many'",
        f"{path}:6:5: roles.0.decodng: unknown key 'decodng'; did you mean 'decoding'?",
        f"{path}:7:7: game.name: missing required field 'name'",
    ]


def test_cli_file_level_problem_and_mixed_results(tmp_path: Path) -> None:
    good = write(tmp_path, BASE, "good.yaml")
    missing = str(tmp_path / "missing.yaml")
    result = CliRunner().invoke(app, ["validate", good, missing])
    assert result.exit_code == 2
    assert result.output.splitlines() == [f"{good}: ok", f"{missing}:1:1: no such file"]


def test_cli_checks_game_names_against_the_registry(tmp_path: Path) -> None:
    from marl import games

    path = write(tmp_path, edit("name: kuhn_poker", "name: chess"))
    result = CliRunner().invoke(app, ["validate", path])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f"{path}:11:9: game.name: unknown game 'chess'; known: {', '.join(games.names())}"
    ]


def test_configuration_md_is_current(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    result = CliRunner().invoke(app, ["schema", "--markdown", "--out", str(out)])
    assert result.exit_code == 0, result.output
    committed = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == committed, (
        "docs/configuration.md is stale: run `marl schema --markdown --out docs/configuration.md`"
    )
    for key in ("`train.league.anchors`", "`roles[].decoding.mode`", "`topology.learning.lr`"):
        assert f"| {key} |" in committed
    assert "| `train.algorithm` |" not in committed  # a setting nothing read


def test_schema_json_is_current(tmp_path: Path) -> None:
    out = tmp_path / "schema.json"
    result = CliRunner().invoke(app, ["schema", "--out", str(out)])
    assert result.exit_code == 0, result.output
    committed = (REPO / "docs" / "schema.json").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == committed, (
        "docs/schema.json is stale: run `marl schema --out docs/schema.json`"
    )
    printed = CliRunner().invoke(app, ["schema"])
    assert printed.exit_code == 0 and printed.output == committed
    schema = json.loads(committed)
    assert schema == configs.json_schema()
    assert schema["properties"]["schema"]["const"] == "marl-teams/v1"
    assert schema["additionalProperties"] is False


# --- overrides: validated copies ---


def test_with_decoding_overrides_the_local_roles_only() -> None:
    cfg = load_config_text(
        edit("game:", "  - name: bot\n    model: random\n    backend: scripted\ngame:")
    )
    choice = cfg.with_decoding(mode="choice")
    assert [r.decoding.mode for r in choice.roles] == ["choice", "choice", "free"]
    assert [r.decoding.temperature for r in choice.roles] == [1.0, 0.5, 1.0]
    greedy = cfg.with_decoding(temperature=0.0)
    assert [r.decoding.temperature for r in greedy.roles] == [0.0, 0.0, 1.0]
    assert [r.decoding.mode for r in greedy.roles] == ["free", "free", "free"]
    assert cfg.with_decoding() == cfg
    assert [r.decoding.temperature for r in cfg.roles] == [1.0, 0.5, 1.0]  # a copy
    with pytest.raises(ValidationError, match="temperature"):
        cfg.with_decoding(temperature=-1.0)


def test_with_game_resets_the_game_arguments() -> None:
    cfg = load_config_text(edit("name: kuhn_poker", "name: kuhn_poker\n  kwargs: {x: 1}"))
    leduc = cfg.with_game("leduc_poker")
    assert (leduc.game.name, leduc.game.kwargs) == ("leduc_poker", {})
    assert (cfg.game.name, cfg.game.kwargs) == ("kuhn_poker", {"x": 1})
    assert leduc.roles == cfg.roles and leduc.name == cfg.name


def test_train_overrides_are_validated_copies() -> None:
    cfg = load_config_text(TRAINED + "train:\n  steps: 3\n  ray: {enabled: false}\n")
    tc = cfg.train
    assert tc is not None
    assert tc.with_overrides() == tc
    short = tc.with_overrides(steps=7, max_minutes=1.5)
    assert (short.steps, short.max_minutes, short.ray) == (7, 1.5, tc.ray)
    cluster = tc.with_overrides(address="ray://head:10001")
    assert (cluster.ray.address, cluster.ray.enabled) == ("ray://head:10001", True)
    assert (cluster.steps, tc.steps, tc.ray.enabled) == (3, 3, False)
    with pytest.raises(ValidationError, match="steps"):
        tc.with_overrides(steps=0)
    assert cfg.replace(train=short).train == short


def test_replace_runs_every_validator_again() -> None:
    cfg = load_config_text(BASE)
    assert cfg.replace(name="u").name == "u" and cfg.name == "t"
    with pytest.raises(ValidationError, match="duplicate role name"):
        cfg.replace(roles=[cfg.roles[0], cfg.roles[0]])
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        cfg.roles[0].replace(count=0)


def test_one_game_name_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from marl import games
    from marl.games import tasks

    known = ", ".join(games.names())
    assert games.check_name("kuhn_poker") is None
    assert games.check_name("chess") == f"unknown game 'chess'; known: {known}"
    assert games.check_name("chess", tasks=True) == f"unknown game 'chess'; known: {known}"
    monkeypatch.setitem(tasks._TASKS, "parity_task", lambda **kw: None)
    assert games.check_name("parity_task", tasks=True) is None
    assert games.check_name("parity_task") == (
        f"'parity_task' is a cooperative task, not a game; known games: {known}"
    )


# --- hostile files: refused fast and located, never a traceback or a hang ---


def validate_cli(*paths: str) -> list[str]:
    result = CliRunner().invoke(app, ["validate", *paths])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.output.splitlines()


def test_alias_bomb_is_refused_at_the_alias(tmp_path: Path) -> None:
    import time

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)
    ]
    start = time.perf_counter()
    out = problems(tmp_path, BASE + "\n".join(lines) + "\n")
    assert time.perf_counter() - start < 2
    assert len(out) == 1 and ":16:15:" in out[0] and "more than 20000 values" in out[0], out


def test_deep_nesting_and_control_characters_are_located(tmp_path: Path) -> None:
    deep = write(tmp_path, BASE + "x: " + "[" * 700 + "]" * 700 + "\n", "deep.yaml")
    nul = write(tmp_path, BASE.replace("name: t", "name: t\x00"), "nul.yaml")
    good = write(tmp_path, BASE, "good.yaml")
    out = validate_cli(deep, nul, good)
    assert out[0].startswith(f"{deep}:12:") and "nesting deeper than 64 levels" in out[0]
    assert out[1] == (
        f"{nul}:2:8: YAML syntax error: character U+0000 is not allowed in YAML "
        "(no NUL or control characters, not even in comments or quotes)"
    )
    assert out[2] == f"{good}: ok"


def test_bad_scalars_are_located(tmp_path: Path) -> None:
    assert problems(tmp_path, BASE + "when: 2024-02-30\n") == [
        f"{tmp_path / 'team.yaml'}:12:7: YAML syntax error: day is out of range for month"
    ]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "    model: tiny-random\n  - name: b",
            "    model: tiny-random\n    count: 100000000\n  - name: b",
            "roles.0.count: input should be less than or equal to 64",
        ),
        (
            "    model: tiny-random\n  - name: b",
            "    model: tiny-random\n    count: 1e30\n  - name: b",
            "roles.0.count: unable to parse input string as an integer",
        ),
        (
            "    model: tiny-random\n  - name: b",
            "    model: tiny-random\n    count: true\n  - name: b",
            "roles.0.count: a number is meant here, not the boolean true",
        ),
        ("temperature: 0.5", "temperature: .inf", "input should be a finite number"),
        ("temperature: 0.5", "temperature: .nan", "input should be a finite number"),
        ("temperature: 0.5", "temperature: false", "a number is meant here, not the boolean false"),
    ],
)
def test_sizes_and_numbers_are_bounded(tmp_path: Path, old: str, new: str, message: str) -> None:
    out = problems(tmp_path, edit(old, new))
    assert len(out) == 1 and message in out[0], out


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("train: {group_size: 1000000000}", "train.group_size: input should be less than or equal"),
        ("train: {lr: 1e30}", "train.lr: input should be less than or equal to 10"),
        ("train: {lr: .inf}", "train.lr: input should be a finite number"),
        ("train: {steps: 1.0e12}", "train.steps: "),
    ],
)
def test_train_sizes_are_bounded(tmp_path: Path, section: str, message: str) -> None:
    out = problems(tmp_path, BASE + section + "\n")
    assert len(out) == 1 and message in out[0] and ":12:" in out[0], out


def test_lora_rank_and_bootstrap_are_bounded(tmp_path: Path) -> None:
    out = problems(
        tmp_path,
        edit(
            "    model: tiny-random\n  - name: b",
            "    model: tiny-random\n    adapter: {r: 1000000000}\n  - name: b",
        ),
    )
    assert (
        len(out) == 1 and "roles.0.adapter.r: input should be less than or equal to 1024" in out[0]
    )
    text = (REPO / "configs" / "tournament_tictactoe.yaml").read_text()
    out = problems(tmp_path, text.replace("bootstrap: 200", "bootstrap: 1000000000"))
    assert len(out) == 1 and "bootstrap: input should be less than or equal to 100000" in out[0]


def test_exponent_floats_read_as_numbers(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, TRAINED + "train: {lr: 3e-4}\n"))
    assert cfg.train is not None and cfg.train.lr == 3e-4


def test_final_role_must_have_one_agent(tmp_path: Path) -> None:
    text = (
        edit(
            "    model: tiny-random\n  - name: b",
            "    model: tiny-random\n    count: 2\n  - name: b",
        )
        + "topology: {final: a}\n"
    )
    out = problems(tmp_path, text)
    assert out == [
        f"{tmp_path / 'team.yaml'}:13:19: topology.final: role 'a' has 2 agents and "
        "one decides; name one of them (a_0, a_1)"
    ]
    assert problems(tmp_path, text.replace("final: a}", "final: a_1}")) != out


def test_validate_checks_game_kwargs_and_seats(tmp_path: Path) -> None:
    kw = write(
        tmp_path, edit("  name: kuhn_poker", "  name: kuhn_poker\n  kwargs: {rounds: 3}"), "kw.yaml"
    )
    bad = write(
        tmp_path, edit("  name: kuhn_poker", "  name: nim\n  kwargs: {piles: []}"), "bad.yaml"
    )
    seats = write(tmp_path, edit("  - name: b", "    count: 2\n  - name: b"), "seats.yaml")
    selfplay = write(
        tmp_path,
        TRAINED.replace(
            "  - name: b\n    model: tiny-random\n    decoding:\n      temperature: 0.5\n", ""
        )
        + "train: {}\n",
        "selfplay.yaml",
    )
    out = validate_cli(kw, bad, seats, selfplay)
    assert out[0] == (
        f"{kw}:12:11: game.kwargs: game 'kuhn_poker' takes no argument 'rounds'; "
        "it takes: illegal_reward, max_retries, render_mode"
    )
    assert out[1].startswith(f"{bad}:12:11: game.kwargs: nim refuses these arguments: piles")
    assert out[2] == f"{seats}:4:3: roles: the team has 3 agents but kuhn_poker has 2 seats"
    assert out[3] == (
        f"{selfplay}:9:8: train: self-play puts the team in all 2 seats of "
        "kuhn_poker but it has 1 agents; add agents or set "
        "train.league.opponents: league"
    )


def test_fewer_agents_than_seats_is_fine_against_opponents(tmp_path: Path) -> None:
    vs = REPO / "configs" / "tictactoe_vs_random_tiny.yaml"
    one = write(
        tmp_path,
        TRAINED.replace(
            "  - name: b\n    model: tiny-random\n    decoding:\n      temperature: 0.5\n", ""
        ),
        "one.yaml",
    )
    assert validate_cli(str(vs), one) == [f"{vs}: ok", f"{one}: ok"]


def test_validate_runs_the_tournament_checks(tmp_path: Path) -> None:
    text = (REPO / "configs" / "tournament_tictactoe.yaml").read_text()
    gpp = write(
        tmp_path, text.replace("games_per_pairing: 400", "games_per_pairing: 401"), "gpp.yaml"
    )
    src = write(tmp_path, text.replace("source: heuristic", "source: missing_run"), "src.yaml")
    out = validate_cli(gpp, src)
    assert out[0].startswith(f"{gpp}:11:20: games_per_pairing: tic_tac_toe has 2 seats")
    assert out[1].startswith(f"{src}:8:31: participants.1.source: neither a bot of tic_tac_toe")


def test_check_kwargs_follows_kwargs_to_the_base_class() -> None:
    from marl import games

    assert games.check_kwargs("split_arithmetic", {"n_agents": 3, "max_retries": 1}) is None
    assert games.check_kwargs("split_arithmetic", {"n_agent": 3}) == (
        "game 'split_arithmetic' takes no argument 'n_agent'; did you mean 'n_agents'?"
    )


def test_training_rules_are_the_files_own(tmp_path: Path) -> None:
    """What needs only the file is reported where it is, before anything is built."""
    f = str(tmp_path / "team.yaml")
    # a file that trains nothing is still a team to run (an export is one): the trainer, not
    # validate, refuses it (tests/train/test_trainer.py)
    assert problems(tmp_path, BASE + "train: {steps: 1}\n") == []
    zero3 = "train:\n  learner: {backend: deepspeed, zero_stage: 3}\n  magnet: {alpha: 1.0}\n"
    assert problems(tmp_path, TRAINED + zero3) == [
        f"{f}:15:19: train.magnet.alpha: train.magnet needs the magnet's adapter whole on the "
        "learner: use ZeRO stage 1 or 2, or the torch backend"
    ]


def test_validate_checks_the_train_section_against_the_game(tmp_path: Path) -> None:
    f = write(
        tmp_path, TRAINED + "train:\n  reward_scales: {nobody: 2}\n  league: {anchors: [x]}\n"
    )
    assert validate_cli(f) == [
        f"{f}:14:18: train.reward_scales: train.reward_scales names ['nobody']; the seats of "
        "kuhn_poker are player_0, player_1",
        f"{f}:15:22: train.league.anchors.0: league anchor 'x' is neither a bot of kuhn_poker "
        "(heuristic, optimal, random) nor a folder nor untrained",
    ]
