"""The clipped GRPO surrogate and its k3 KL term, by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl.train.loss import grpo_loss


def test_grpo_loss_clips_by_hand() -> None:
    logp = torch.log(torch.tensor([[1.5], [0.5], [1.1]]))  # ratios 1.5, 0.5, 1.1 (old = 0)
    old = torch.zeros(3, 1)
    adv = torch.tensor([1.0, -1.0, 2.0])
    parts = grpo_loss(logp, old, adv, torch.ones(3, 1), clip_low=0.2, clip_high=0.2)
    # A>0, rho 1.5 -> clipped 1.2; A<0, rho 0.5 -> min(-0.5, -0.8) = -0.8; rho 1.1 -> 2.2
    assert float(parts.loss) == pytest.approx(-(1.2 - 0.8 + 2.2) / 3)
    assert parts.clip_frac == pytest.approx(2 / 3)


def test_grpo_loss_kl_is_k3_and_zero_at_the_reference() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    parts = grpo_loss(
        logp, logp.detach(), torch.zeros(1), torch.ones(1, 2), ref_logp=logp.detach(), beta=0.1
    )
    assert float(parts.kl) == 0.0
    ref = torch.tensor([[-1.5, -2.0]])
    parts = grpo_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 2), ref_logp=ref, beta=0.1)
    q = -0.5
    assert parts.kl == pytest.approx((np.exp(q) - q - 1) / 2)


def test_dual_clip_bounds_a_negative_advantage_at_large_ratios_by_hand() -> None:
    # ratios 5, 2, 5 (old = 0); advantages -1, -1, +1
    logp = torch.log(torch.tensor([[5.0], [2.0], [5.0]])).requires_grad_(True)
    old, adv, mask = torch.zeros(3, 1), torch.tensor([-1.0, -1.0, 1.0]), torch.ones(3, 1)
    plain = grpo_loss(logp, old, adv, mask)
    # -min(rho A, clip(rho) A), clip 0.2: 5, 2 (unclipped for A < 0, rho > 1), -1.2
    assert float(plain.loss.detach()) == pytest.approx((5 + 2 - 1.2) / 3)
    dual = grpo_loss(logp, old, adv, mask, dual_clip=3.0)
    # A < 0: the loss is at most -c A = 3, so 5 -> 3; rho 2 and A > 0 as before
    assert float(dual.loss.detach()) == pytest.approx((3 + 2 - 1.2) / 3)
    (grad,) = torch.autograd.grad(dual.loss, logp)
    # the bounded token carries no gradient; rho 2 keeps d(-rho A)/dlogp = rho / 3
    assert grad[:, 0].tolist() == pytest.approx([0.0, 2 / 3, 0.0])
