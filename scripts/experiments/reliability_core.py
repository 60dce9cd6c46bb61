"""What every reliability probe shares: running ``marl``, judging its outcome, a trained run."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from scripts.experiments.reliability_texts import TEAM

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    family: str
    case: str
    verdict: str  # ok, wrong, traceback, hung, lost
    detail: str = ""


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (but locks) with a hash of its bytes."""
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def marl(cwd: Path, *args: str, timeout: float = 120, stdin: str = "") -> tuple[int | None, str]:
    """``python -m marl ARGS`` in ``cwd``: its exit code (None: killed at ``timeout``) and
    its output."""
    env = {**os.environ, "PYTHONPATH": f"{cwd}{os.pathsep}{REPO}", "COLUMNS": "100"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "marl", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(stdin, timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return None, proc.communicate()[0]


def judge(
    code: int | None,
    out: str,
    expect: int = 2,
    keep: dict[str, str] | None = None,
    now: dict[str, str] | None = None,
    forbidden: Path | None = None,
) -> tuple[str, str]:
    """The column a finished probe counts in, and why: a refusal is exit 2 with its error on
    one line (a traceback counts in its own column)."""
    tail = out.strip().splitlines()[-3:]
    if code is None:
        return "hung", " / ".join(tail)
    if "Traceback (most recent call last)" in out:
        return "traceback", " / ".join(tail)
    if keep is not None and keep != now:
        return "lost", "the run folder changed"
    if forbidden is not None and forbidden.exists():
        return "wrong", f"{forbidden.name} was created"
    if code != expect:
        return "wrong", f"exit {code}, expected {expect}: " + " / ".join(tail)
    return "ok", tail[-1] if tail else ""


def case(family: str, name: str, cwd: Path, *args: str, **kw) -> Outcome:
    """Run one probe: ``kw`` are :func:`marl`'s ``timeout``/``stdin`` and :func:`judge`'s
    ``expect``/``forbidden``, and ``keep``: a folder that must not change."""
    keep = kw.pop("keep", None)
    before = snapshot(keep) if keep is not None else None
    code, out = marl(cwd, *args, timeout=kw.pop("timeout", 120), stdin=kw.pop("stdin", ""))
    now = snapshot(keep) if keep is not None else None
    verdict, detail = judge(code, out, keep=before, now=now, **kw)
    return Outcome(family, name, verdict, detail)


def trained_run(base: Path) -> Path:
    """A 2-step tiny Kuhn run (checkpoints 1 and 2, metrics), trained once per family."""
    folder = base / "source"
    if not (folder / "run" / "latest").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "team.yaml").write_text(TEAM.format(game="{name: kuhn_poker}"))
        code, out = marl(folder, "train", "team.yaml", "--out", "run", "--steps", "2", timeout=300)
        if code != 0:
            raise RuntimeError(f"the probes' source run failed:\n{out}")
    return folder


def copy_run(base: Path, name: str) -> Path:
    dst = base / name
    shutil.copytree(trained_run(base), dst)
    return dst
