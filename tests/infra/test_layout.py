"""The run folder layout: pointers, what a user's path resolves to, and atomic writes that
leave nothing half-written (checkpoints, exports)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from marl.config import load_config
from marl.infra.atomic import atomic_write
from marl.infra.layout import (
    BEST,
    LATEST,
    METRICS,
    STATE_FILE,
    TEAM_FILE,
    adapter_folder,
    checkpoint_dir,
    checkpoint_folder,
    latest_checkpoint,
    point,
    pointed,
    resolve,
)
from marl.orchestrator.serving.export import export_run
from marl.train.checkpoint import save_checkpoint

TINY = Path(__file__).parents[2] / "configs" / "tiny_test.yaml"


def fake_checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    ck = checkpoint_dir(run, step)
    ck.mkdir(parents=True)
    (ck / TEAM_FILE).write_text("team")
    if complete:
        (ck / STATE_FILE).write_text("{}")
    return ck


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    """A run with checkpoints 1 and 2; latest names 2, best names 1."""
    run = tmp_path / "run"
    one, two = fake_checkpoint(run, 1), fake_checkpoint(run, 2)
    point(run, LATEST, two)
    point(run, BEST, one)
    (run / METRICS).write_text("{}\n")
    return run


def test_checkpoint_folders_and_pointers(run: Path) -> None:
    assert checkpoint_dir(run, 12) == run / "checkpoints" / "step_000012"
    assert adapter_folder(run, "player") == run / "adapters" / "player"
    assert (run / "latest").read_text() == "step_000002"
    assert (run / "best").read_text() == "step_000001"
    assert sorted(p.name for p in run.iterdir()) == ["best", "checkpoints", "latest", METRICS]
    assert latest_checkpoint(run) == checkpoint_dir(run, 2)
    assert latest_checkpoint(run, BEST) == checkpoint_dir(run, 1)
    assert pointed(run / "nowhere") is None and latest_checkpoint(run / "nowhere") is None


def test_a_pointer_to_an_incomplete_checkpoint_is_no_checkpoint(run: Path) -> None:
    point(run, LATEST, fake_checkpoint(run, 3, complete=False))
    assert pointed(run) == checkpoint_dir(run, 3)
    assert latest_checkpoint(run) is None


def test_paths_resolve_to_the_folder_a_team_loads_from(run: Path, tmp_path: Path) -> None:
    two, one = checkpoint_dir(run, 2), checkpoint_dir(run, 1)
    assert resolve(run) == (two, run)
    assert resolve(str(run)) == (two, run)
    assert resolve(run / "latest") == (two, run)
    assert resolve(run / "best") == (one, run)
    assert resolve(one) == (one, run)  # a checkpoint inside a run keeps its run (metrics)
    exported = tmp_path / "exported"
    exported.mkdir()
    assert resolve(exported) == (exported, None)
    loose = fake_checkpoint(tmp_path / "other", 5)  # no metrics.jsonl: not a run's
    assert resolve(loose) == (loose, None)
    for path in (run, run / "best", one, exported):
        assert checkpoint_folder(path) == resolve(path).folder


def test_a_pointer_named_file_outside_a_run_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "latest").write_text("step_000001")  # no checkpoints/ next to it
    assert resolve(tmp_path) == (tmp_path, None)
    assert resolve(tmp_path / "latest") == (tmp_path / "latest", None)


def test_atomic_folder_replaces_and_an_exception_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "deep" / "out"
    with atomic_write(final) as tmp:
        assert tmp.parent == final.parent and tmp.is_dir() and not final.exists()
        (tmp / "a").write_text("1")
    assert (final / "a").read_text() == "1"
    with pytest.raises(RuntimeError, match="disk full"), atomic_write(final) as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError("disk full")
    assert (final / "a").read_text() == "1"  # the old folder, untouched
    assert [p.name for p in final.parent.iterdir()] == ["out"]
    with atomic_write(final) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["b"]


def test_atomic_file_and_no_overwrite(tmp_path: Path) -> None:
    final = tmp_path / "pointer"
    with atomic_write(final, folder=False) as tmp:
        tmp.write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_write(final, folder=False) as tmp:
        tmp.write_text("new")
        raise KeyboardInterrupt
    assert final.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["pointer"]
    folder = tmp_path / "published"
    with pytest.raises(OSError), atomic_write(folder, overwrite=False) as tmp:
        (tmp / "mine").write_text("late")
        folder.mkdir()  # another writer published first
        (folder / "theirs").write_text("first")
    assert [p.name for p in folder.iterdir()] == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pointer", "published"]


def test_stale_temps_of_killed_writers_are_swept(tmp_path: Path) -> None:
    final = tmp_path / "out"
    stale, fresh = tmp_path / ".out.tmp-dead", tmp_path / ".out.tmp-live"
    stale.mkdir()
    fresh.mkdir()
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    with atomic_write(final) as tmp:
        (tmp / "x").write_text("")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.tmp-live", "out"]


def test_a_failed_checkpoint_leaves_the_previous_one_and_its_pointer(tmp_path: Path) -> None:
    cfg = load_config(TINY)
    run = tmp_path / "run"
    first = save_checkpoint(run, 1, cfg, {}, {}, {}, {"league": {}})
    assert first == checkpoint_dir(run, 1) and latest_checkpoint(run) == first
    assert {TEAM_FILE, STATE_FILE} <= {p.name for p in first.iterdir()}

    def crash(folder: Path) -> None:
        (folder / "topology.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(run, 2, cfg, {}, {}, {}, {"league": {}}, extra=crash)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]
    assert latest_checkpoint(run) == first


def test_a_failed_export_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = load_config(TINY)
    cfg = tiny.model_copy(update={"roles": [tiny.roles[0].model_copy(update={"adapter": None})]})
    run = tmp_path / "run"
    point(run, BEST, save_checkpoint(run, 1, cfg, {}, {}, {}, {"league": {}}))
    out = export_run(run / "best", tmp_path / "out")
    assert (out / TEAM_FILE).is_file() and (out / "export.json").is_file()

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("no card")

    monkeypatch.setattr("marl.orchestrator.serving.export.model_card", broken)
    with pytest.raises(RuntimeError, match="no card"):
        export_run(run, tmp_path / "fresh")
    with pytest.raises(RuntimeError, match="no card"):
        export_run(run, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]
    assert (out / "export.json").is_file()  # the earlier export is still whole
