"""The reliability probes' cases, by family (see :mod:`scripts.experiments.reliability`)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from scripts.experiments.reliability_core import REPO, Outcome, case, copy_run, judge, marl
from scripts.experiments.reliability_servers import server_family, weights_family
from scripts.experiments.reliability_texts import ENV_CASES, TEAM, env_team, user_env


def team_file_family(base: Path, _: int) -> Iterator[Outcome]:
    """A team file that names code to run: refused before anything is called."""
    targets = {
        "os:system": '{command: "touch PWNED"}',
        "subprocess:run": '{args: ["touch", "PWNED"]}',
        "builtins:exec": "{source: \"open('PWNED', 'w')\"}",
        "shutil:rmtree": '{path: "."}',
    }
    for target, kwargs in targets.items():
        for command in (["validate"], ["play", "--episodes", "1"], ["train", "--steps", "1"]):
            folder = base / f"{target.replace(':', '_')}-{command[0]}"
            folder.mkdir(parents=True)
            game = f'{{entry_point: "{target}", kwargs: {kwargs}}}'
            (folder / "team.yaml").write_text(TEAM.format(game=game))
            (folder / "keep.txt").write_text("the user's file")
            args = [*command, "team.yaml", *(["--out", "run"] if command[0] == "train" else [])]
            yield case(
                "team file runs code",
                f"{target} in {command[0]}",
                folder,
                *args,
                forbidden=folder / "PWNED",
                keep=folder,
            )


RUN_DAMAGE: dict[str, Callable[[Path], None]] = {
    "latest missing": lambda run: (run / "latest").unlink(),
    "latest dangling": lambda run: (run / "latest").write_text("step_000009"),
    "latest a folder": lambda run: ((run / "latest").unlink(), (run / "latest").mkdir()),
    "latest garbage": lambda run: (run / "latest").write_bytes(b"\xff\xfe\x00"),
    "latest outside": lambda run: (run / "latest").write_text("../../.."),
    "checkpoint incomplete": lambda run: (run / "checkpoints/step_000002/state.json").unlink(),
    "metrics damaged": lambda run: (run / "metrics.jsonl").write_text(
        '{"step": 0}\n{"step": 1, "ag\n{"step": 2}\n'
    ),
}


def runs_family(base: Path, _: int) -> Iterator[Outcome]:
    """Resumes of damaged run folders: refused, the folder unchanged."""
    for name, damage in RUN_DAMAGE.items():
        folder = copy_run(base, name.replace(" ", "-"))
        damage(folder / "run")
        yield case(
            "run folders",
            f"resume, {name}",
            folder,
            *("train", "team.yaml", "--out", "run", "--resume", "--steps", "3"),
            keep=folder / "run",
        )
    folder = copy_run(base, "no-resume")
    yield case(
        "run folders",
        "train on a run without --resume",
        folder,
        *("train", "team.yaml", "--out", "run", "--steps", "3"),
        keep=folder / "run",
    )
    yield two_trainers(copy_run(base, "two-trainers"))


def two_trainers(folder: Path) -> Outcome:
    """A second trainer on a folder a first one is training: refused at once, the first run
    goes on to its end with its steps in order."""
    env = {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{REPO}"}
    args = [sys.executable, "-m", "marl", "train", "team.yaml", "--out", "run", "--resume"]
    metrics = folder / "run/metrics.jsonl"
    logged = metrics.read_text().count("\n")
    first = subprocess.Popen(
        [*args, "--steps", "100000", "--max-minutes", "1"],  # busy for a minute
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while metrics.read_text().count("\n") == logged and time.monotonic() < deadline:
        time.sleep(0.5)  # a step logged: the first one holds the lock
    code, out = marl(
        folder, "train", "team.yaml", "--out", "run", "--resume", "--steps", "50", timeout=60
    )
    first_code = first.wait(timeout=300)  # ends on its time budget
    lines = (folder / "run/metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    if first_code != 0 or steps != sorted(set(steps)):
        return Outcome("run folders", "two trainers", "wrong", f"first exit {first_code}, {steps}")
    verdict, detail = judge(code, out)
    return Outcome("run folders", "two trainers on one folder", verdict, detail)


def envs_family(base: Path, _: int) -> Iterator[Outcome]:
    """A user's own game that raises, exits or hangs: one line naming the env and the call.
    One that never ends is cut at ``game.max_turns`` and the command completes."""
    for name in ENV_CASES:
        for command in (["validate"], ["play", "--episodes", "1"], ["train", "--steps", "1"]):
            folder = base / f"{name}-{command[0]}"
            folder.mkdir(parents=True)
            (folder / "probe_env.py").write_text(user_env(name))
            (folder / "team.yaml").write_text(env_team())
            extra = ["--out", "run", "--max-minutes", "0.5"] if command[0] == "train" else []
            yield case(
                "user games",
                f"{name} in {command[0]}",
                folder,
                *command,
                "team.yaml",
                *extra,
                timeout=180,
                expect=0 if name == "never ends" else 2,  # cut at game.max_turns, truncated
            )


def mutations_family(base: Path, count: int) -> Iterator[Outcome]:
    """Random edits of every recipe, validated in this process."""
    from typer.testing import CliRunner

    from marl.cli import app

    rng = random.Random(0)
    base.mkdir(parents=True, exist_ok=True)
    for recipe in sorted((REPO / "configs").glob("*.yaml")):
        for i in range(count):
            path = base / f"{recipe.stem}-{i}.yaml"
            path.write_text(mutate(recipe.read_text(), rng))
            signal.alarm(60)
            try:
                result = CliRunner().invoke(app, ["validate", str(path)])
            finally:
                signal.alarm(0)
            if isinstance(result.exception, TimeoutError):
                verdict = "hung"
            elif result.exception is not None and not isinstance(result.exception, SystemExit):
                verdict = "traceback"
            else:
                verdict = "ok" if result.exit_code in (0, 2) else "wrong"
            yield Outcome("mutated configs", path.name, verdict, str(result.exception or ""))


VALUES = ["-1", "0", "1e309", "99999999999999", '"x"', "[]", "{}", "null", "²", "true", "[1, [2]]"]


def mutate(text: str, rng: random.Random) -> str:
    """One random edit: a value replaced, a line dropped, doubled or shifted, or a cut."""
    lines = text.splitlines()
    i = rng.randrange(len(lines))
    kind = rng.choice(["value", "drop", "double", "indent", "cut"])
    if kind == "value" and ":" in lines[i]:
        key = lines[i].split(":", 1)[0]
        lines[i] = f"{key}: {rng.choice(VALUES)}"
    elif kind == "drop":
        del lines[i]
    elif kind == "double":
        lines.insert(i, lines[i])
    elif kind == "indent":
        lines[i] = " " * rng.choice([1, 3, 6]) + lines[i]
    else:
        return text[: rng.randrange(len(text))]
    return "\n".join(lines) + "\n"


def _alarm(*_) -> None:
    raise TimeoutError("validate ran over 60 s")


signal.signal(signal.SIGALRM, _alarm)

FAMILIES: dict[str, Callable[[Path, int], Iterator[Outcome]]] = {
    "team-file": team_file_family,
    "runs": runs_family,
    "envs": envs_family,
    "weights": weights_family,
    "server": server_family,
    "mutations": mutations_family,
}
