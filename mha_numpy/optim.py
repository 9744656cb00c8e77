"""Optimizers and gradient clipping, as ``torch.optim`` and ``torch.nn.utils.clip_grad_norm_`` define them,
formula for formula, so that a torch copy of a model trains to the same numbers (tests/test_train.py,
tests/test_finetune.py, notebooks/07). Each optimizer updates a ``params`` dict of NumPy arrays in place from a
``grads`` dict with the same names (what every ``backward`` here returns); nothing else of mha_numpy is needed.

    opt = Adam(model.params, lr=3e-3)
    grads, norm = clip_grad_norm(model.backward(d_logits, cache), max_norm=1.0)
    opt.step(grads)
"""

from __future__ import annotations

import numpy as np


def global_norm(grads: dict[str, np.ndarray]) -> float:
    """The L2 norm of all gradients taken together as one long vector."""
    return float(np.sqrt(sum(np.sum(g * g) for g in grads.values())))


def clip_grad_norm(
    grads: dict[str, np.ndarray], max_norm: float, norm: float | None = None
) -> tuple[dict[str, np.ndarray], float]:
    """Scale all gradients together so that their global L2 norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: factor = min(1, max_norm / (norm + 1e-6)).
    Returns (new dict of clipped gradients, the global norm before clipping); ``grads`` is not modified.
    norm: the global norm when the caller knows it already (``grads`` then may be one group of a larger set:
    the finetune demo clips each optimizer's group on its own thread), else ``global_norm(grads)``.
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    norm = global_norm(grads) if norm is None else norm
    factor = min(1.0, max_norm / (norm + 1e-6))
    return {name: g * factor for name, g in grads.items()}, norm


class SGD:
    """p ← p - lr · buf with buf ← momentum · buf + g (buf = g at the first step), as torch.optim.SGD.

    With momentum 0, plain gradient descent p ← p - lr · g.
    """

    def __init__(self, params: dict[str, np.ndarray], lr: float = 1e-3, momentum: float = 0.0) -> None:
        if not lr > 0 or not 0 <= momentum < 1:
            raise ValueError(f"need lr > 0 and 0 <= momentum < 1, got lr={lr}, momentum={momentum}")
        self.params, self.lr, self.momentum = params, lr, momentum
        self.buf: dict[str, np.ndarray] = {}

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """Update every parameter in place from its gradient."""
        for name, p in self.params.items():
            g = grads[name]
            if self.momentum:
                self.buf[name] = g.copy() if name not in self.buf else self.momentum * self.buf[name] + g
                g = self.buf[name]
            p -= self.lr * g


class Adam:
    """Adam with bias correction, as torch.optim.Adam (same defaults, no weight decay).

    m ← β1 m + (1 - β1) g        v ← β2 v + (1 - β2) g²           (running moments, start at 0)
    m̂ = m / (1 - β1ᵗ)           v̂ = v / (1 - β2ᵗ)                 (undo the pull towards 0)
    p ← p - lr · m̂ / (sqrt(v̂) + eps)
    """

    def __init__(
        self,
        params: dict[str, np.ndarray],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if not lr > 0 or not all(0 <= b < 1 for b in betas) or not eps > 0:
            raise ValueError(f"need lr > 0, 0 <= betas < 1, eps > 0; got lr={lr}, betas={betas}, eps={eps}")
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = {name: np.zeros_like(p) for name, p in params.items()}
        self.v = {name: np.zeros_like(p) for name, p in params.items()}
        self.t = 0

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """Update every parameter in place from its gradient."""
        self.t += 1
        b1, b2 = self.betas
        for name, p in self.params.items():
            g, m, v = grads[name], self.m[name], self.v[name]
            # in place, the same operations in the same order as the formulas above (the same bits): a fresh
            # array per operation cost about 3x the time on MiniLM's 10M parameters (allocation, page faults)
            m *= b1
            m += (1 - b1) * g  # m ← β1 m + (1 - β1) g
            v *= b2
            g2 = (1 - b2) * g
            g2 *= g
            v += g2  # v ← β2 v + (1 - β2) g²
            m_hat = m / (1 - b1**self.t)
            denom = np.divide(v, 1 - b2**self.t, out=g2)  # v̂, in g2's memory
            np.sqrt(denom, out=denom)
            denom += self.eps
            m_hat *= self.lr
            m_hat /= denom
            p -= m_hat  # p ← p - lr · m̂ / (sqrt(v̂) + eps)


class AdamW(Adam):
    """Adam with decoupled weight decay, as torch.optim.AdamW: first p ← p · (1 - lr · weight_decay), then
    the Adam step. Names in ``no_decay`` (e.g. biases and LayerNorm weights, as BERT fine-tuning does) are
    not decayed. ``lr`` may be changed between steps (a schedule: ``warmup_linear``)."""

    def __init__(
        self,
        params: dict[str, np.ndarray],
        *,
        weight_decay: float = 1e-2,
        no_decay: tuple[str, ...] | set[str] = (),
        **adam,
    ) -> None:
        super().__init__(params, **adam)  # lr, betas, eps: Adam's, with its defaults and checks
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        self.weight_decay, self.no_decay = weight_decay, set(no_decay)

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """Decay, then the Adam update; every parameter in place."""
        for name, p in self.params.items():
            if name not in self.no_decay:
                p *= 1 - self.lr * self.weight_decay
        super().step(grads)


def warmup_linear(step: int, total: int, warmup: int) -> float:
    """The learning-rate factor of step ``step`` (0-based, as torch's LambdaLR sees it): a linear rise over
    ``warmup`` steps, then a linear decay to 0 at ``total`` (BERT's schedule)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, (total - step) / max(1, total - warmup))
