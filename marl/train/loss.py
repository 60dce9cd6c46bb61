"""The GRPO objective on token log-probs.

Per token t of a decision with advantage A (docs/algorithms.md#the-grpo-loss):

    rho_t = exp(log pi_theta(t) - log pi_old(t))
    L_clip = -min(rho_t * A, clip(rho_t, 1 - eps_lo, 1 + eps_hi) * A)
             (A < 0 with a dual clip c > 1: L_clip = min(L_clip, -c * A))
    L_kl   = beta * (exp(q_t) - q_t - 1),   q_t = log pi_ref(t) - log pi_theta(t)   (k3, >= 0)
    L_mag  = alpha * KL_t(pi_theta || magnet)   (exact over the legal actions, or k3 per token)
    L      = sum_t (L_clip + L_kl + L_mag) / n_tokens  -  entropy_coef * mean(H)

When the samples come from a behaviour policy pi_behav other than the learner's (another
engine's numerics, train.mismatch; older weights, train.async), decoupled PPO (Hilton et al.
2022) splits the two roles of pi_old: the proximal policy pi_prox, the learner's own log-probs
recomputed before the update, anchors the clip, and importance weights correct for the
behaviour policy:

    w_t   = pi_prox(t) / pi_behav(t)              (decoupled; truncated_is: min(w_t, C))
    rho_t = exp(log pi_theta(t) - log pi_prox(t))
    L_t   = -w_t * min(rho_t * A, clip(rho_t, 1 - eps_lo, 1 + eps_hi) * A)

so the step's size is bounded around the policy the learner has (the clip) whatever the age
of the samples, while the weights keep the gradient an estimate under pi_prox.  w_t = 1
exactly when pi_behav is pi_prox (a synchronous run on the learner's engine).

Token-level averaging (every token of the batch weighs the same) keeps long completions from
being down-weighted.  In ``choice`` decoding a decision is a single "token" whose log-prob is
``log pi(a|s)`` over the legal actions, so the same function applies; there the magnet term is
the exact KL over the whole distribution (docs/algorithms.md#magnet-schedule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossParts:
    loss: torch.Tensor
    clip_frac: float
    kl: float
    entropy: float
    kl_magnet: float = 0.0


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's per-sample estimator of KL(pi || ref) on samples drawn from pi: >= 0."""
    q = ref_logp - logp
    return torch.exp(q) - q - 1


def exact_kl(logp_all: torch.Tensor, ref_logp_all: torch.Tensor) -> torch.Tensor:
    """KL(pi || ref) = sum_a pi(a) (log pi(a) - log ref(a)) over the last axis."""
    return (logp_all.exp() * (logp_all - ref_logp_all)).sum(-1)


def importance_weights(
    prox_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_t = min(pi_prox(t) / pi_behav(t), cap), the raw ratios), both 0 on padding."""
    raw = (prox_logp - behav_logp).exp()
    return raw.clamp(max=cap) * mask, raw * mask


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    weights: torch.Tensor | None = None,
    magnet_kl: torch.Tensor | None = None,
    alpha: float = 0.0,
    dual_clip: float | None = None,
) -> LossParts:
    """All tensors are [decisions, tokens] except ``adv`` [decisions] and ``entropy``
    [decisions] (mean entropy per decision); ``mask`` is 1 on real tokens; ``weights``
    (importance weights of the behaviour policy, :func:`importance_weights`; ``old_logp`` is
    then the proximal policy's) scale each token's surrogate;
    ``magnet_kl`` holds each token's KL to the magnet (:func:`exact_kl` or :func:`k3`),
    weighted by ``alpha``. ``dual_clip`` bounds a negative advantage's loss at ``-c * A``
    however large the ratio: off-policy moves (a league snapshot's) can have ``pi_theta``
    far above the ``pi_old`` that sampled them, and PPO's clip holds only ``rho < 1`` there
    (Ye et al. 2020)."""
    n = mask.sum().clamp(min=1)
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    surr = torch.minimum(ratio * a, ratio.clamp(1 - clip_low, 1 + clip_high) * a)
    if dual_clip is not None:
        surr = torch.where(a < 0, torch.maximum(surr, dual_clip * a), surr)
    per_token = -surr if weights is None else -surr * weights
    kl = torch.zeros((), device=logp.device)
    if ref_logp is not None and beta > 0:
        per = k3(logp, ref_logp)
        per_token = per_token + beta * per
        kl = (per * mask).sum() / n
    kl_magnet = torch.zeros((), device=logp.device)
    if magnet_kl is not None and alpha > 0:
        per_token = per_token + alpha * magnet_kl
        kl_magnet = (magnet_kl * mask).sum() / n
    loss = (per_token * mask).sum() / n
    ent = torch.zeros((), device=logp.device) if entropy is None else entropy.mean()
    if entropy is not None and entropy_coef > 0:
        loss = loss - entropy_coef * ent
    clipped = ((ratio - 1).abs() > torch.where(a > 0, clip_high, clip_low)).float()
    return LossParts(
        loss,
        float((clipped * mask).sum() / n),
        float(kl.detach()),
        float(ent.detach()),
        float(kl_magnet.detach()),
    )
