"""A damaged adapter file (cut short, a tensor of another shape, a tensor missing, an integer
tensor) is one line naming the file and the tensor, exit 2, in every command that reads one:
``marl train --resume``, ``marl eval``, ``marl export`` (which then writes nothing) and
``marl serve``; nothing of the run changes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from helpers import REPO, tiny_team
from marl.cli import app
from marl.infra.layout import checkpoint_folder

TRAIN = "  steps: 1\n  group_size: 2\n  groups_per_step: 1\n  ray: {enabled: false}\n"
WEIGHTS = Path("adapters/player/adapter_model.safetensors")


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``team.yaml``, ``run`` (one step, one checkpoint) and ``export`` (its team)."""
    root = tmp_path_factory.mktemp("damaged")
    (root / "team.yaml").write_text(tiny_team("kuhn_poker", TRAIN))
    done = cli("train", str(root / "team.yaml"), "--out", str(root / "run"))
    assert done.exit_code == 0, done.output
    done = cli("export", str(root / "run"), "--out", str(root / "export"))
    assert done.exit_code == 0, done.output
    return root


def _rewrite(file: Path, change: Callable[[dict[str, torch.Tensor], str], None]) -> str:
    """Change the tensors of ``file`` in place; returns the name of the one changed."""
    tensors = load_file(str(file))
    name = sorted(tensors)[0]
    change(tensors, name)
    save_file(tensors, str(file))
    return name


def truncate(file: Path) -> str:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    return "not a readable safetensors file"


def reshape(file: Path) -> str:
    name = _rewrite(file, lambda t, n: t.__setitem__(n, torch.zeros(t[n].shape[0] + 1, 3)))
    return f"tensor {name} has shape"


def drop(file: Path) -> str:
    name = _rewrite(file, lambda t, n: t.pop(n))
    return f"tensor {name} is missing"


def to_int8(file: Path) -> str:
    name = _rewrite(file, lambda t, n: t.__setitem__(n, t[n].to(torch.int8)))
    return f"tensor {name} is torch.int8, not floating point"


def poison(file: Path) -> str:
    name = _rewrite(file, lambda t, n: t[n].view(-1).__setitem__(0, float("nan")))
    return f"tensor {name} holds NaN or infinite values"


DAMAGES = [truncate, reshape, drop, to_int8, poison]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def damaged_copy(trained: Path, tmp_path: Path, what: str, damage: Callable) -> tuple[Path, str]:
    """A copy of ``trained/what`` whose adapter file has ``damage``; the file and the words
    the error must say."""
    copy = tmp_path / what
    shutil.copytree(trained / what, copy)
    file = checkpoint_folder(copy) / WEIGHTS
    return copy, f"{file}: {damage(file)}"


def refused(result, says: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert says in result.output.replace("\n", ""), result.output


@pytest.mark.parametrize("damage", DAMAGES)
def test_resume(trained: Path, tmp_path: Path, damage: Callable) -> None:
    run, says = damaged_copy(trained, tmp_path, "run", damage)
    before = snapshot(run)
    refused(cli("train", str(trained / "team.yaml"), "--out", str(run), "--resume"), says)
    assert snapshot(run) == before


@pytest.mark.parametrize("damage", DAMAGES)
def test_eval_of_a_run(trained: Path, tmp_path: Path, damage: Callable) -> None:
    run, says = damaged_copy(trained, tmp_path, "run", damage)
    refused(cli("eval", "exploitability", str(run)), says)


@pytest.mark.parametrize("damage", DAMAGES)
def test_export_writes_nothing(trained: Path, tmp_path: Path, damage: Callable) -> None:
    run, says = damaged_copy(trained, tmp_path, "run", damage)
    refused(cli("export", str(run), "--out", str(tmp_path / "out")), says)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", DAMAGES)
def test_serve_of_an_export(trained: Path, tmp_path: Path, damage: Callable) -> None:
    export, says = damaged_copy(trained, tmp_path, "export", damage)
    done = subprocess.run(
        [sys.executable, "-m", "marl", "serve", str(export), "--port", "0"],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and says in done.stderr.replace("\n", "")
