"""docs/guide.md runs: every fenced block is a file to write (``title=FILE``), ``marl``
commands (``bash``), Python run in one namespace (``python``) or output (``text``); the
blocks run in order in one empty folder, and any failing one fails the test."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marl.cli import app

REPO = Path(__file__).parents[2]
GUIDE = REPO / "docs" / "guide.md"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)
PORT = "8000"  # the guide's serving port; the test serves on a free one instead


@dataclass(frozen=True)
class Block:
    lang: str
    title: str | None
    body: str
    line: int

    @property
    def kind(self) -> str:
        if self.title:
            return "file"
        return {"bash": "bash", "python": "python", "text": "output"}.get(self.lang, "unknown")


def blocks(text: str) -> list[Block]:
    out = []
    for m in FENCE.finditer(text):
        lang, *attrs = m.group(1).split()
        opts = dict(a.split("=", 1) for a in attrs)
        out.append(Block(lang, opts.get("title"), m.group(2), text.count("\n", 0, m.start()) + 1))
    return out


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_every_block_is_run_or_marked_as_output() -> None:
    found = blocks(GUIDE.read_text())
    assert GUIDE.read_text().count("```") == 2 * len(found), "an unclosed fence"
    unknown = [f"line {b.line}: ```{b.lang}" for b in found if b.kind == "unknown"]
    assert not unknown, unknown
    kinds = {b.kind for b in found}
    assert {"file", "bash", "python"} <= kinds
    for b in found:
        if b.kind == "bash":
            lines = [ln for ln in b.body.splitlines() if ln.strip()]
            assert all(ln.startswith("marl ") for ln in lines), (b.line, lines)


def marl(line: str, where: Path) -> None:
    """One ``marl ...`` line through the CLI in this process (``< FILE`` is its input)."""
    args = shlex.split(line)
    stdin = None
    if "<" in args:
        i = args.index("<")
        stdin, args = (where / args[i + 1]).read_text(), args[:i] + args[i + 2 :]
    result = CliRunner().invoke(app, args[1:], input=stdin)
    assert result.exit_code == 0, f"{line}\n{result.output}\n{result.exception!r}"
    assert "Traceback" not in result.output, f"{line}\n{result.output}"


def background(line: str, where: Path, servers: list[subprocess.Popen]) -> None:
    """``marl ... &``: started as ``python -m cli ...``, waited for until it serves."""
    args = shlex.split(line.removesuffix("&"))[1:]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "marl", *args],
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    servers.append(proc)
    first = proc.stdout.readline()
    assert "serving team" in first, f"{line}\n{first}{proc.stderr.read()}"


def test_the_guide_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    port = free_port()
    namespace: dict = {"__name__": "guide"}
    servers: list[subprocess.Popen] = []
    ran = 0
    try:
        for b in blocks(GUIDE.read_text()):
            body = b.body.replace(PORT, port)
            if b.kind == "file":
                (tmp_path / b.title).write_text(body)
            elif b.kind == "bash":
                for line in filter(str.strip, body.splitlines()):
                    if line.rstrip().endswith("&"):
                        background(line, tmp_path, servers)
                    else:
                        marl(line, tmp_path)
            elif b.kind == "python":
                exec(compile(body, f"{GUIDE}:{b.line}", "exec"), namespace)
            ran += b.kind != "output"
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(timeout=30)
    assert ran == sum(b.kind != "output" for b in blocks(GUIDE.read_text()))
    assert (tmp_path / "run" / "best").exists() and (tmp_path / "cup" / "ratings.csv").exists()


def test_the_guides_own_game_passes_the_pettingzoo_api_test(tmp_path: Path, monkeypatch) -> None:
    """The env the guide teaches from (``my_games.py``) is a correct PettingZoo env."""
    import importlib

    from pettingzoo.test import api_test

    (source,) = [b.body for b in blocks(GUIDE.read_text()) if b.title == "my_games.py"]
    (tmp_path / "guide_games.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("guide_games")
    api_test(module.closest(), num_cycles=50)
    api_test(module.closest(target=0), num_cycles=50)
