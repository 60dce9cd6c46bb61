"""Metrics loggers: flattening, when W&B goes offline, a real offline W&B run that holds every
step's metrics (read back from its ``.wandb`` file), resume, and the error for a missing
extra."""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest

from helpers import tiny_team
from marl.config import load_config_text
from marl.train.loggers import JsonlLogger, flatten, unavailable, wandb_has_api_key
from marl.train.trainer import Trainer, TrainingError

TRAIN = """\
  steps: {steps}
  group_size: 4
  groups_per_step: 2
  lr: 0.02
  checkpoint_every: 1
  eval_every: 0  # off: a run cut short evaluates its last step, a whole one does not
  ray: {{enabled: false}}
  loggers: [jsonl, wandb]
"""


def test_flatten_keeps_numbers_under_slash_paths() -> None:
    m = {
        "step": 3,
        "skipped": False,
        "snapshot": None,
        "learner": {"tiny": {"loss": 0.5, "agent_grad_norms": {"p/p_0": 1.0}}},
    }
    assert flatten(m) == {
        "step": 3,
        "skipped": False,
        "learner/tiny/loss": 0.5,
        "learner/tiny/agent_grad_norms/p/p_0": 1.0,
    }


def test_jsonl_keeps_the_lines_a_resume_does_not_replay(tmp_path: Path) -> None:
    cfg = load_config_text(tiny_team("kuhn_poker", TRAIN.format(steps=4)))
    path = tmp_path / "metrics.jsonl"

    def steps() -> list[int]:
        return [json.loads(ln)["step"] for ln in path.read_text().splitlines()]

    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in [0, 1, 3]))
    # resumed at the step-2 checkpoint, killed before its line: 3 goes, 2 comes from `last`
    lg = JsonlLogger(tmp_path, cfg, start_step=2, last={"step": 2, "loss": 0.5})
    lg.log({"step": 3})
    lg.close()
    assert steps() == [0, 1, 2, 3]
    JsonlLogger(tmp_path, cfg, start_step=3, last={"step": 3}).close()  # nothing to add
    assert steps() == [0, 1, 2, 3]
    JsonlLogger(tmp_path, cfg, start_step=0).close()  # a fresh run logs its step 0 again
    assert steps() == []


@pytest.fixture()
def no_wandb_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No API key anywhere, and W&B's own files kept inside tmp_path."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path


def test_api_key_from_env_or_netrc(no_wandb_login: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not wandb_has_api_key()
    netrc = no_wandb_login / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_has_api_key()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not wandb_has_api_key()  # the key is for another host
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert wandb_has_api_key()


def _records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: a 7-byte W&B header, then LevelDB's log format
    (32 KiB blocks of chunks with a crc32/length/type header; FULL or FIRST..LAST)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    return out


def _history(run_dir: Path) -> dict[int, dict]:
    """step -> the metrics of every offline W&B run in ``run_dir`` (later runs win)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    steps: dict[int, dict] = {}
    for f in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for raw in _records(f):
            try:
                rec = wandb_internal_pb2.Record.FromString(raw)
            except DecodeError:  # a record wandb-core was still writing; history is checked below
                continue
            if rec.WhichOneof("record_type") != "history":
                continue
            row = {
                ("/".join(it.nested_key) or it.key): json.loads(it.value_json)
                for it in rec.history.item
            }
            steps[row["_step"]] = row
    return steps


def _history_with(run_dir: Path, steps: list[int], timeout: float = 20.0) -> dict[int, dict]:
    """The offline history once it holds ``steps``: wandb-core may still be flushing the last
    records when ``finish()`` returns.  Times out with whatever is there (the test then fails)."""
    deadline = time.monotonic() + timeout
    while True:
        history = _history(run_dir)
        if set(steps) <= set(history) or time.monotonic() > deadline:
            return history
        time.sleep(0.2)


def _run(run: Path, steps: int, resume: bool = False) -> list[dict]:
    cfg = load_config_text(tiny_team("kuhn_poker", TRAIN.format(steps=steps)))
    Trainer(cfg, run, resume=resume).fit()
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def test_offline_wandb_run_holds_every_step(no_wandb_login: Path) -> None:
    pytest.importorskip("wandb")
    run = no_wandb_login / "run"
    rows = _run(run, steps=2)
    history = _history_with(run, [1, 2])
    assert sorted(history) == [1, 2]
    for row in rows:
        logged = history[row["step"]]
        for key, value in flatten(row).items():
            assert logged[key] == pytest.approx(value), key
    run_id = (run / "wandb-run-id").read_text().strip()
    assert [p.name for p in (run / "wandb").glob("offline-run-*")] == [
        p.name for p in (run / "wandb").glob(f"offline-run-*-{run_id}")
    ]

    # resumed from the step-2 checkpoint: the same W&B run goes on with step 3
    rows = _run(run, steps=3, resume=True)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (run / "wandb-run-id").read_text().strip() == run_id
    assert len(list((run / "wandb").glob(f"offline-run-*-{run_id}"))) == 2
    history = _history_with(run, [1, 2, 3])
    assert sorted(history) == [1, 2, 3]
    assert history[3]["agents/player_0@player_0/reward"] == pytest.approx(
        rows[2]["agents"]["player_0@player_0"]["reward"]
    )


def test_missing_wandb_fails_before_any_compute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` sees uninstalled
    assert "pip install 'marl-teams[wandb]'" in unavailable(["jsonl", "wandb"])
    with pytest.raises(TrainingError, match=r"^train.loggers has 'wandb' but wandb is not "):
        Trainer(load_config_text(tiny_team("kuhn_poker", TRAIN.format(steps=1))), tmp_path / "run")
    assert not (tmp_path / "run").exists()
