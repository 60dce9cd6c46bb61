"""Learner groups: a learner of 2 ranks (Ray actors, one gloo group) makes the same updates as
one process, for the torch backend and DeepSpeed ZeRO-1/2/3, and its state resumes on 1 rank
and the reverse.  ZeRO-3's forwards are collective, so under it the learner scores with one
forward per micro-batch (the shared-head scoring makes a number of forwards that depends on
the rank's share, as a test below shows), and think roles are refused.

Everything is fp32 on the tiny model; two adapters and three agents each, so every rank's
share holds several agents and the padding of the shorter shares is exercised.
"""

from __future__ import annotations

import copy
import json
import random

import pytest
import ray
import torch

from helpers import tiny_team
from marl.config import load_config_text
from marl.config.loader import ConfigError
from marl.infra.placement import PlacementError
from marl.train.checkpoint import load_optimizer_state, save_optimizer_state
from marl.train.group import LearnerGroup
from marl.train.learner import TrainItem
from marl.train.ranks import Ranks
from marl.train.runtime import LearnerProcess, LearnerRank
from marl.train.trainer import Trainer

ADAPTERS = ["player", "rival"]
KEY = "tiny-random"

TRAIN = """\
  lr: 0.05
  max_grad_norm: 0.5
  learner: {{backend: {backend}, zero_stage: {stage}, micro_batch: 3}}
  ray: {{cpus_per_learner: 0.5}}
"""
RIVAL = (
    "  - {name: rival, model: tiny-random, adapter: {r: 4, alpha: 8}, decoding: {mode: choice}}\n"
)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(backend: str, stage: int = 1) -> dict:
    text = tiny_team("kuhn_poker", TRAIN.format(backend=backend, stage=stage), 1, RIVAL)
    return load_config_text(text).model_dump(by_alias=True)


def _batch(seed: int, n: int = 14) -> list[TrainItem]:
    """Choice decisions of three agents per adapter, with random advantages; some prompts
    repeat, so micro-batches share states."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 200) for _ in range(5)] for _ in range(n - 3)]
    items = []
    for i in range(n):
        cands = [[rng.randrange(3, 200) for _ in range(rng.randrange(1, 4))] for _ in range(3)]
        items.append(
            TrainItem(
                adapter=ADAPTERS[i % 2],
                agent=f"seat{i % 3}",
                prompt_ids=prompts[i % len(prompts)],
                completion_ids=cands[1],
                old_logprobs=[-1.1],
                advantage=rng.uniform(-1, 1),
                candidate_ids=cands,
                choice=1,
            )
        )
    return items


def _close(a: dict, b: dict) -> None:
    for adapter in a:
        for k, v in a[adapter].items():
            torch.testing.assert_close(b[adapter][k], v, rtol=0, atol=1e-5)


def _same_stats(a, b) -> None:
    assert not a.skipped and not b.skipped
    assert b.loss == pytest.approx(a.loss, abs=1e-6)
    assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
    assert b.tokens == a.tokens
    assert b.agent_grad_norms.keys() == a.agent_grad_norms.keys()
    for k, v in a.agent_grad_norms.items():
        assert b.agent_grad_norms[k] == pytest.approx(v, rel=1e-5)


def test_shares_are_balanced_by_tokens_and_cover_the_batch() -> None:
    items = [
        TrainItem("player", "a", [i % 4], [1] * (1 + i % 5), [-1.0] * (1 + i % 5), 0.5)
        for i in range(20)
    ]
    shares = [Ranks(r, 3).share(items) for r in range(3)]
    assert sorted(map(id, sum(shares, []))) == sorted(map(id, items))
    loads = [sum(it.tokens for it in s) for s in shares]
    assert max(loads) - min(loads) <= 5  # at most one item's tokens apart
    assert shares == [Ranks(r, 3).share(list(reversed(items))) for r in range(3)]
    assert Ranks().share(items) == items


def test_a_group_the_cluster_cannot_hold_is_refused_in_one_line(local_ray) -> None:
    with pytest.raises(PlacementError, match=r"ranks: 2 ranks of \{'CPU': 2\.0\}"):
        LearnerGroup(ray.remote(LearnerRank), _cfg("torch"), KEY, 2, {"CPU": 2.0}, timeout_s=1)


@pytest.mark.parametrize(
    ("backend", "stage"), [("torch", 1), ("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3)]
)
def test_two_ranks_update_as_one_and_resume_across_rank_counts(
    local_ray, tmp_path, backend: str, stage: int
) -> None:
    cfg = _cfg(backend, stage)
    one = LearnerProcess(cfg, KEY)
    group = LearnerGroup(ray.remote(LearnerRank), cfg, KEY, 2, {"CPU": 0.5})
    try:
        _close(one.weights(), group.call("weights"))
        assert ray.get(group.submit("weights"))[1] == {}  # one copy comes back: rank 0's
        for seed in range(2):
            _same_stats(one.update(_batch(seed), seed), group.call("update", _batch(seed), seed))
        saved = copy.deepcopy((one.weights(), one.optimizer_state()))  # live tensors on a CPU
        two = group.call("weights"), group.call("optimizer_state")
        save_optimizer_state(two[1], tmp_path / "two")  # the checkpoint's format
        _same_stats(one.update(_batch(2), 2), group.call("update", _batch(2), 2))
        final = one.weights()
        _close(final, group.call("weights"))  # three updates: equal within 1e-5

        # the 2-rank state resumes on 1 rank, and the 1-rank state on 2 ranks
        resumed = LearnerProcess(cfg, KEY)
        resumed.load(two[0], load_optimizer_state(tmp_path / "two")[0])
        resumed.update(_batch(2), 2)
        _close(final, resumed.weights())
        group.call("load", *saved)
        group.call("update", _batch(2), 2)
        _close(final, group.call("weights"))
    finally:
        group.shutdown()


def _forwards_per_chunk(learner, score) -> list[list[int]]:
    """Per rank of 2, the decoder forwards ``score(learner, chunk)`` makes for each of its
    micro-batches of batch 0 (the first decoder layer's calls)."""
    layer = next(m for m in learner.host.model.modules() if type(m).__name__.endswith("Layer"))
    calls = [0]
    hook = layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    counts = []
    for rank in range(2):
        ranks, seq = Ranks(rank, 2), []
        for adapter in ADAPTERS:
            group = [it for it in _batch(0) if it.adapter == adapter]
            with torch.no_grad(), learner.host.use(adapter):
                for chunk, _ in ranks.schedule(group, learner.chunks):
                    calls[0] = 0
                    score(learner, chunk)
                    seq.append(calls[0])
        counts.append(seq)
    hook.remove()
    return counts


def test_under_zero3_every_micro_batch_takes_one_forward_on_every_rank() -> None:
    """ZeRO-3 all-gathers a module's parameters in each of its forwards, so the ranks'
    forwards must pair up one to one.  The shared-head scoring runs a micro-batch's
    candidates in one forward, or two when some candidate has more than one token, after
    its shared heads: two ranks' shares of one batch, padded to the same micro-batches,
    still differ in forwards (seen under ZeRO-3: one rank waiting in a forward's all-gather,
    the other past it).  Scoring every (prompt + candidate) row in one forward does not."""
    learner = LearnerProcess(_cfg("torch"), KEY).learner
    tree = _forwards_per_chunk(learner, lambda lr, chunk: lr.choice_dists(chunk))
    assert len(tree[0]) == len(tree[1]) and tree[0] != tree[1]
    learner.host.share_prefix = False

    def pairs(lr, chunk):
        lr.host.pair_scores([it.prompt_ids for it in chunk], [it.candidate_ids for it in chunk])

    assert _forwards_per_chunk(learner, pairs) == [[1] * len(tree[0])] * 2
    chunk = _batch(0)[:5]
    learner.host.share_prefix = True
    with torch.no_grad():
        expected = learner.choice_scores(chunk)
        learner.host.share_prefix = False
        got = learner.host.pair_scores(
            [it.prompt_ids for it in chunk], [it.candidate_ids for it in chunk]
        )
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_zero3_over_several_ranks_refuses_think_roles() -> None:
    zero3 = TRAIN.format(backend="deepspeed", stage=3).replace(
        "micro_batch: 3", "micro_batch: 3, ranks: 2"
    )
    load_config_text(tiny_team("kuhn_poker", zero3, 1, RIVAL))  # choice roles: accepted
    think = RIVAL.replace("mode: choice", "mode: think")
    with pytest.raises(ConfigError, match="the think passes of rival do not"):
        load_config_text(tiny_team("kuhn_poker", zero3, 1, think))
    with pytest.raises(ConfigError, match="set ray.enabled"):
        load_config_text(
            tiny_team("kuhn_poker", "  ray: {enabled: false}\n  learner: {ranks: 2}\n")
        )


KUHN = """\
  steps: {steps}
  group_size: 2
  groups_per_step: 1
  checkpoint_every: 1
  ray: {{cpus_per_worker: 0.5, cpus_per_learner: 0.5}}
  learner: {{ranks: {ranks}}}
"""


def test_a_trainer_on_two_ranks_checkpoints_once_and_resumes_on_one(local_ray, tmp_path) -> None:
    """Through the trainer and its Ray runtime: a 2-rank learner group trains a step and
    checkpoints; the run resumes with one rank and trains the next."""
    run = tmp_path / "run"
    for steps, ranks, resume in ((1, 2, False), (2, 1, True)):
        cfg = load_config_text(tiny_team("kuhn_poker", KUHN.format(steps=steps, ranks=ranks)))
        trainer = Trainer(cfg, run, resume=resume)
        try:
            assert [len(g.actors) for g in trainer.runtime.learners.values()] == [ranks]
            trainer.fit()
        finally:
            trainer.runtime.shutdown()
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "learner" in r] == [1, 2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
