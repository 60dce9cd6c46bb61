"""The shape of the code base, checked: one installed namespace, imports that go downward only,
rooms of bounded size, ruff clean and formatted, no ``sys.path`` edits and no private names
reached across packages."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO

LIBRARY = REPO / "marl"
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 60

#: What each sub-package may import from the project (besides itself): the layers, bottom up.
#: ``marl.train`` takes the team runtime from the orchestrator and nothing else of it.
ALLOWED = {
    "config": set(),
    "infra": set(),
    "games": {"config", "infra"},
    "topologies": {"config", "infra"},
    "agents": {"config", "infra", "games", "topologies"},
    "orchestrator": {"config", "infra", "games", "topologies", "agents", "train"},
    "train": {"config", "infra", "games", "topologies", "agents", "orchestrator.team"},
    "cli": {"config", "infra", "games", "topologies", "agents", "orchestrator", "train"},
}


def _modules(root: Path) -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(root.rglob("*.py"))]


def _package(path: Path) -> str:
    """``marl/train/learner.py`` -> ``train``."""
    parts = path.relative_to(LIBRARY).parts
    return parts[0] if len(parts) > 1 else ""


def _imported(tree: ast.Module) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every ``import``/``from ... import`` of the project."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, []) for a in node.names)
    return [f for f in found if f[1] == "marl" or f[1].startswith("marl.")]


def test_imports_go_downward_only():
    wrong = []
    for path, tree in _modules(LIBRARY):
        own = _package(path)
        if not own:
            continue
        for line, module, names in _imported(tree):
            targets = [module] if module != "marl" else [f"marl.{n}" for n in names]
            for target in targets:
                parts = target.split(".")[1:]
                if not parts or parts[0] == own:
                    continue
                allowed = ALLOWED[own]
                if parts[0] in allowed or ".".join(parts[:2]) in allowed:
                    continue
                wrong.append(f"{path.relative_to(REPO)}:{line}: {own} imports {target}")
    assert not wrong, "\n".join(wrong)


def _untidy(path: Path, tree: ast.Module) -> list[str]:
    """What in one file edits ``sys.path`` or reaches a private name it does not own: a
    ``_name`` imported from another sub-package, or (in scripts) any ``obj._name``."""
    found = []
    in_library = path.is_relative_to(LIBRARY)
    own = _package(path) if in_library else None
    for line, module, names in _imported(tree):
        package = module.split(".")[1] if "." in module else ""
        if package != own and any(n.startswith("_") for n in names):
            found.append(f"{line}: imports private names of {module}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if ast.unparse(node).startswith("sys.path.") and name in ("insert", "append"):
            found.append(f"{node.lineno}: edits sys.path")
        private = name.startswith("_") and not name.startswith("__")
        owner = ast.unparse(node.value)
        if not in_library and private and owner not in ("self", "cls"):
            found.append(f"{node.lineno}: reaches {owner}.{name}")
    return found


def test_no_sys_path_edits_or_private_access_outside_tests():
    wrong = []
    for root in (LIBRARY, REPO / "scripts"):
        for path, tree in _modules(root):
            rel = path.relative_to(REPO)
            wrong.extend(f"{rel}:{f}" for f in _untidy(path, tree))
    assert not wrong, "\n".join(wrong)


def _sizes() -> dict[str, int]:
    """Every library class and function over its limit: ``path:name`` -> lines."""
    over = {}
    for path, tree in _modules(LIBRARY):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                limit = MAX_CLASS_LINES
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                limit = MAX_FUNCTION_LINES
            else:
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                over[f"{path.relative_to(REPO)}:{node.name}"] = lines
    return over


def test_classes_and_functions_stay_small():
    over = _sizes()
    assert not over, (
        f"over {MAX_CLASS_LINES} (class) / {MAX_FUNCTION_LINES} (function) lines: {over}"
    )


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True
    )


def test_ruff_check_clean():
    done = _ruff("check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_clean():
    done = _ruff("format", "--check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_wheel_installs_only_marl(tmp_path):
    """``pip wheel --no-deps .`` of a copy of the sources (no stale ``build/`` of a checkout):
    one top-level import package, ``marl``."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "marl", src / "marl", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("marl_teams-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"marl"}
