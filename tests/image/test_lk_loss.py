"""The hybrid LK loss (``train.loss: lk_hybrid``) against its equation, by hand, on a 3-token example.

Runs inside the pipeline image (torch, speculators 0.3.0). The expected value and gradient are computed here in
plain Python floats from the equation in :func:`eagle3ops.stages.draft.lk_hybrid_loss`'s docstring, not with
torch: ``L_t = lambda_t * KL(p_t || q_t) + (1 - lambda_t) * (1 - alpha_t)``, ``alpha_t = sum_v min(p_tv, q_tv)``,
``lambda_t = exp(-eta * alpha_t)`` held constant in the gradient; reduced as speculators' KL (masked sum over the
mask's sum + 1e-5). The gradient by hand: ``dKL/dz_j = q_j - p_j`` and ``dalpha/dz_j = q_j * (1[q_j < p_j] - S)``
with ``S = sum_{v: q_v < p_v} q_v`` (softmax's Jacobian ``dq_v/dz_j = q_v (delta_vj - q_j)``).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")  # noqa: F841 - the image always has it; the host run leaves tests/image out

from eagle3ops.stages.draft import install_loss, lk_hybrid_loss  # noqa: E402

# 3 positions over a 4-token draft vocabulary: a near miss, a cold position (little overlap), a near match.
DRAFT = [[2.0, 0.5, -1.0, 0.0], [-2.0, 3.0, 0.0, -1.0], [0.3, 0.2, 0.1, 0.0]]
TARGET = [[1.5, 1.0, -0.5, 0.0], [3.0, -2.0, 0.5, 0.0], [0.25, 0.25, 0.1, -0.1]]


def _softmax(z: list[float]) -> list[float]:
    m = max(z)
    e = [math.exp(x - m) for x in z]
    return [x / sum(e) for x in e]


def _by_hand(mask: list[float], eta: float) -> tuple[float, list[list[float]]]:
    """(loss, d loss / d draft logits) from the equation, in floats."""
    denom = sum(mask) + 1e-5
    total, grads = 0.0, []
    for z, t, m in zip(DRAFT, TARGET, mask, strict=True):
        q, p = _softmax(z), _softmax(t)
        alpha = sum(min(a, b) for a, b in zip(p, q))
        kl = sum(a * math.log(a / b) for a, b in zip(p, q))
        lam = math.exp(-eta * alpha)
        total += m * (lam * kl + (1 - lam) * (1 - alpha))
        s = sum(b for a, b in zip(p, q) if b < a)
        grads.append([m / denom * (lam * (q[j] - p[j]) - (1 - lam) * q[j] * ((1.0 if q[j] < p[j] else 0.0) - s))
                      for j in range(4)])
    return total / denom, grads


@pytest.mark.parametrize("mask", [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
def test_lk_hybrid_value_and_gradient_equal_the_equation_by_hand(mask):
    logits = torch.tensor([DRAFT], dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([TARGET], dtype=torch.float64)
    loss = lk_hybrid_loss(logits, targets, torch.tensor([mask], dtype=torch.float64), eta=3.0)
    loss.backward()
    want, want_grad = _by_hand(mask, 3.0)
    assert loss.item() == pytest.approx(want, rel=1e-6)
    for got_row, want_row in zip(logits.grad[0].tolist(), want_grad, strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-5, abs=1e-9)
    # The cold position (index 1) leans on KL, the near match (index 2) on the acceptance rate: lambda orders them.
    alphas = [sum(min(a, b) for a, b in zip(_softmax(t), _softmax(z))) for z, t in zip(DRAFT, TARGET)]
    assert alphas[1] < 0.2 < 0.9 < alphas[2]


def test_lk_with_eta_zero_is_speculators_kl_and_install_swaps_speculators_loss():
    """eta = 0 gives lambda = 1: plain KL, equal to speculators' own ``loss_function``; ``install_loss`` puts the LK
    loss where speculators' ``compute_metrics`` looks it up and ``kl`` puts speculators' back."""
    from speculators.models.eagle3 import core

    logits, targets = torch.tensor([DRAFT]), torch.tensor([TARGET])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    install_loss("kl")
    kl_fn = core.loss_function
    assert kl_fn.__module__ == "speculators.models.eagle3.core"
    kl = kl_fn(logits, targets, mask).item()
    assert lk_hybrid_loss(logits, targets, mask, eta=0.0).item() == pytest.approx(kl, rel=1e-5)
    try:
        install_loss("lk_hybrid", eta=3.0)
        assert core.loss_function(logits, targets, mask).item() == pytest.approx(
            _by_hand([1.0, 0.0, 1.0], 3.0)[0], rel=1e-5)
        assert core.loss_function(logits, targets, mask).item() != pytest.approx(kl, rel=1e-3)
    finally:
        install_loss("kl")
    assert core.loss_function is kl_fn
    with pytest.raises(ValueError, match="train.loss"):
        install_loss("tv")
