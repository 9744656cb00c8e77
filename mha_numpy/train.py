"""Learn by training: a tiny attention model trained end to end with the hand-written backward.

The model, every piece a forward/backward pair (the attention is ``MultiHeadAttention``):

    tokens (B, L) ──embedding tok_emb──► tok (B, L, E) ─┐
    positions (B, L) ─embedding pos_emb─► pos (B, L, E) ─┴─ add ──► x (B, L, E)
    x ──MultiHeadAttention(x, x, x)──► a (B, L, E)                  self-attention
    x, a ──add──► h (B, L, E)                                        the residual
    h ──linear W_out, b_out──► logits (B, L, V)                      a read-out at every position
    logits, targets ──softmax cross-entropy──► loss (mean over the B·L tokens)

The toy tasks have a known answer: to ``reverse`` a sequence, output i must read input L-1-i (an
anti-diagonal attention map); to ``shift`` it by k, output i reads input i-k (a shifted diagonal,
wrapping around). The match must come from *positions*, not token values: only the learned position
embedding tells the query at i which key is at L-1-i, so that is what the attention learns.

Optimizers (SGD with momentum, Adam with bias correction) and clipping by global norm follow
``torch.optim`` and ``torch.nn.utils.clip_grad_norm_`` formula for formula, so that a torch copy of
the model trains to the same numbers (tests/test_train.py, notebooks/07).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import functional as F
from ._checks import as_float_array
from .attention import MHACache, MultiHeadAttention

# --------------------------------------------------------------------------- embedding


def _check_ids(ids, name: str, num_rows: int) -> np.ndarray:
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {ids.dtype} with shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_rows):
        raise ValueError(
            f"{name} with shape {ids.shape} has ids outside [0, {num_rows}): min {ids.min()}, max {ids.max()}"
        )
    return ids


def embedding_forward(ids: np.ndarray, table: np.ndarray):
    """Look up one row of ``table`` per id.

    ids: (...) integers in [0, N)   table: (N, E)   ->   out: (..., E) with out[i] = table[ids[i]]
    """
    table = as_float_array(table, "table", ndim=2)
    ids = _check_ids(ids, "ids", table.shape[0])
    out = table[ids]  # F1: (..., E), a copy
    return out, (ids, table.shape)


def embedding_backward(d_out: np.ndarray, cache):
    """d_out: (..., E) -> d_table: (N, E).

    A scatter-add: every occurrence of id n adds its d_out row to d_table[n]. ``d_table[ids] += d_out``
    would be wrong, because with repeated ids NumPy keeps only one of the writes; ``np.add.at`` adds them all.
    """
    ids, shape = cache
    d_table = np.zeros(shape, dtype=d_out.dtype)  # (N, E); rows never looked up get 0
    np.add.at(d_table, ids, d_out)  # ← F1: d_table[ids[i]] += d_out[i] for every i, repeats accumulate
    return d_table


# --------------------------------------------------------------------------- add (the residual)


def add_forward(a: np.ndarray, b: np.ndarray):
    """out = a + b, same shapes. Used for token + position and for the residual x + attention(x)."""
    if np.shape(a) != np.shape(b):
        raise ValueError(f"add needs equal shapes, got a {np.shape(a)} and b {np.shape(b)}")
    return a + b, None  # F1


def add_backward(d_out: np.ndarray, cache=None):
    """d_out -> (da, db): a sum passes its gradient unchanged to both terms."""
    return d_out, d_out  # ← F1: ∂(a + b)/∂a = ∂(a + b)/∂b = identity


# --------------------------------------------------------------------------- softmax cross-entropy


def softmax_cross_entropy_forward(logits: np.ndarray, targets: np.ndarray):
    """Mean over tokens of -log softmax(logits)[target], computed stably through log-softmax.

    logits: (..., V)   targets: (...) integers in [0, V)   ->   loss: float, cache
    """
    logits = as_float_array(logits, "logits")
    targets = _check_ids(targets, "targets", logits.shape[-1])
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets with shape {targets.shape} must match logits {logits.shape} without the last axis")
    shifted = logits - logits.max(axis=-1, keepdims=True)  # F1: (..., V), largest entry 0: exp cannot overflow
    log_z = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # F2: (..., 1), log of the normaliser
    log_p = shifted - log_z  # F3: (..., V) log-softmax
    picked = np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]  # F4: (...) log p[target]
    loss = -picked.mean()  # F5: mean over the N = targets.size tokens
    return float(loss), (np.exp(log_p), targets)


def softmax_cross_entropy_backward(d_loss: float, cache):
    """d_loss (a scalar, 1.0 for the loss itself) -> d_logits (..., V).

    The log-softmax VJP, d_shifted = d_log_p - p · Σ d_log_p; with d_log_p = -onehot / N this is
    the familiar (p - onehot) / N.
    """
    p, targets = cache
    d_picked = np.full(targets.shape, -d_loss / targets.size, dtype=p.dtype)  # ← F5: (...)
    d_log_p = np.zeros_like(p)  # (..., V)
    np.put_along_axis(d_log_p, targets[..., None], d_picked[..., None], axis=-1)  # ← F4: only the target entry
    d_shifted = d_log_p - p * d_log_p.sum(axis=-1, keepdims=True)  # ← F3, F2: ∂log_z/∂shifted = p
    return d_shifted  # ← F1: each row of d_shifted sums to 0, so the subtracted max gets no gradient


# --------------------------------------------------------------------------- the model


@dataclass
class ModelCache:
    """Intermediates of ``TinyAttentionModel.forward``; ``attention.attn_weights`` is (B, H, L, L)."""

    x: np.ndarray  # (B, L, E) token + position embedding, the attention's input
    attention: MHACache
    _caches: dict

    @property
    def attn_weights(self) -> np.ndarray:
        """(B, H, L, L) attention weights after softmax: row i = where position i reads from."""
        return self.attention.attn_weights


class TinyAttentionModel:
    """Embeddings, one self-attention layer with a residual, a read-out to the vocabulary.

    vocab_size V, max_length L (rows of the position table), embed_dim E, num_heads H.
    ``params`` holds tok_emb (V, E), pos_emb (L, E), the attention's W_q ... b_o (the same arrays
    as ``mha.params``), W_out (V, E) and b_out (V,). Optimizers update them in place.
    Initialization as in torch: embeddings N(0, 1), read-out U(±1/sqrt(E)), attention as
    ``MultiHeadAttention``.
    """

    def __init__(
        self,
        vocab_size: int,
        max_length: int,
        embed_dim: int = 32,
        num_heads: int = 1,
        bias: bool = True,
        dtype=np.float64,
        rng: int | np.random.Generator | None = None,
    ) -> None:
        for name, value in (("vocab_size", vocab_size), ("max_length", max_length)):
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.mha = MultiHeadAttention(embed_dim, num_heads, bias=bias, dtype=dtype, rng=rng)
        self.vocab_size, self.max_length, self.dtype = vocab_size, max_length, self.mha.dtype
        E, bound = embed_dim, 1 / np.sqrt(embed_dim)
        self.params: dict[str, np.ndarray] = {
            "tok_emb": rng.standard_normal((vocab_size, E)).astype(dtype),
            "pos_emb": rng.standard_normal((max_length, E)).astype(dtype),
            **self.mha.params,
            "W_out": rng.uniform(-bound, bound, (vocab_size, E)).astype(dtype),
            "b_out": rng.uniform(-bound, bound, vocab_size).astype(dtype),
        }

    def __repr__(self) -> str:
        return (
            f"TinyAttentionModel(vocab_size={self.vocab_size}, max_length={self.max_length}, "
            f"embed_dim={self.mha.embed_dim}, num_heads={self.mha.num_heads}, dtype={self.dtype.name})"
        )

    def forward(self, tokens: np.ndarray) -> tuple[np.ndarray, ModelCache]:
        """tokens (B, L) integers in [0, V), L <= max_length -> logits (B, L, V), cache."""
        tokens = _check_ids(tokens, "tokens", self.vocab_size)
        if tokens.ndim != 2 or not 0 < tokens.shape[1] <= self.max_length:
            raise ValueError(f"tokens must have shape (B, L) with 0 < L <= {self.max_length}, got {tokens.shape}")
        P = self.params
        B, L = tokens.shape
        positions = np.broadcast_to(np.arange(L), (B, L))  # (B, L): 0, 1, ..., L-1 in every row

        tok, c_tok = embedding_forward(tokens, P["tok_emb"])  # F1: (B, L, E)
        pos, c_pos = embedding_forward(positions, P["pos_emb"])  # F2: (B, L, E)
        x, _ = add_forward(tok, pos)  # F3: (B, L, E)
        a, c_att = self.mha.forward(x, x, x)  # F4: (B, L, E) self-attention: x is query, key and value
        h, _ = add_forward(x, a)  # F5: (B, L, E) the residual
        logits, c_out = F.linear_forward(h, P["W_out"], P["b_out"])  # F6: (B, L, V) the read-out
        return logits, ModelCache(x=x, attention=c_att, _caches=dict(tok=c_tok, pos=c_pos, out=c_out))

    __call__ = forward

    def backward(self, d_logits: np.ndarray, cache: ModelCache) -> dict[str, np.ndarray]:
        """d_logits (B, L, V) -> one gradient per ``params`` key, with that parameter's shape."""
        c = cache._caches
        g: dict[str, np.ndarray] = {}
        d_h, g["W_out"], g["b_out"] = F.linear_backward(d_logits, c["out"])  # ← F6: (B, L, E)
        d_x_skip, d_a = add_backward(d_h)  # ← F5: (B, L, E) each, the residual copies the gradient
        ga = self.mha.backward(d_a, cache.attention)  # ← F4: "query", "key", "value" (B, L, E), W_q ...
        # x fed four paths (F5's skip, F4's query, key and value); its gradient is their sum
        d_x = d_x_skip + ga["query"] + ga["key"] + ga["value"]  # (B, L, E)
        g.update({name: ga[name] for name in self.mha.params})
        d_tok, d_pos = add_backward(d_x)  # ← F3: (B, L, E) each
        g["tok_emb"] = embedding_backward(d_tok, c["tok"])  # ← F1: (V, E)
        g["pos_emb"] = embedding_backward(d_pos, c["pos"])  # ← F2: (L, E), summed over the batch
        return {name: g[name] for name in self.params}  # same order as params

    def loss_and_grads(self, tokens: np.ndarray, targets: np.ndarray):
        """One forward and backward: -> (loss, logits (B, L, V), grads dict, cache)."""
        logits, cache = self.forward(tokens)
        loss, c_loss = softmax_cross_entropy_forward(logits, targets)
        d_logits = softmax_cross_entropy_backward(1.0, c_loss)  # (B, L, V)
        return loss, logits, self.backward(d_logits, cache), cache


# --------------------------------------------------------------------------- optimizers


def global_norm(grads: dict[str, np.ndarray]) -> float:
    """The L2 norm of all gradients taken together as one long vector."""
    return float(np.sqrt(sum(np.sum(g * g) for g in grads.values())))


def clip_grad_norm(grads: dict[str, np.ndarray], max_norm: float) -> tuple[dict[str, np.ndarray], float]:
    """Scale all gradients together so that their global L2 norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: factor = min(1, max_norm / (norm + 1e-6)).
    Returns (new dict of clipped gradients, the global norm before clipping); ``grads`` is not modified.
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    norm = global_norm(grads)
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
            g = grads[name]
            self.m[name] = b1 * self.m[name] + (1 - b1) * g
            self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
            m_hat = self.m[name] / (1 - b1**self.t)
            v_hat = self.v[name] / (1 - b2**self.t)
            p -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


# --------------------------------------------------------------------------- toy tasks

TASKS = ("reverse", "shift")


def make_batch(
    task: str, rng: np.random.Generator, batch_size: int, length: int, vocab_size: int, shift: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Random token ids and the task's answer: -> tokens (B, L), targets (B, L), both int64.

    reverse: targets[:, i] = tokens[:, L-1-i].   shift: targets[:, i] = tokens[:, (i - shift) mod L].
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    tokens = rng.integers(0, vocab_size, size=(batch_size, length))  # (B, L)
    targets = tokens[:, ::-1] if task == "reverse" else np.roll(tokens, shift, axis=1)  # (B, L)
    return tokens, np.ascontiguousarray(targets)


def ideal_attention(task: str, length: int, shift: int = 1) -> np.ndarray:
    """(L, L) map with a 1 where output (query) i must read input (key) j: the pattern to learn."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    i = np.arange(length)
    j = length - 1 - i if task == "reverse" else (i - shift) % length
    ideal = np.zeros((length, length))
    ideal[i, j] = 1.0
    return ideal


def attention_share(attn: np.ndarray, ideal: np.ndarray) -> float:
    """Fraction of the attention mass on the ideal keys, averaged over queries (and heads): 1 = perfect.

    attn: (..., L, L) weights whose rows sum to 1; ideal: (L, L) 0/1.
    """
    return float((attn * ideal).sum(axis=-1).mean())


# --------------------------------------------------------------------------- training loop


@dataclass
class TrainResult:
    """What ``train`` returns.

    history: lists per step: "step", "loss", "accuracy" (token accuracy on that step's batch),
        "grad_norm" (before clipping).
    attention: (H, L, L) final attention weights averaged over the evaluation batch.
    snapshots: step -> (H, L, L) the same average at that moment (step 0 = before training).
    accuracy: final token accuracy on the held-out evaluation batch.
    ideal: (L, L) the task's ideal attention map.
    """

    model: TinyAttentionModel
    task: str
    history: dict[str, list]
    attention: np.ndarray
    snapshots: dict[int, np.ndarray]
    accuracy: float
    ideal: np.ndarray
    config: dict = field(default_factory=dict)


def evaluate(model: TinyAttentionModel, tokens: np.ndarray, targets: np.ndarray) -> tuple[float, float, np.ndarray]:
    """-> (loss, token accuracy, (H, L, L) attention weights averaged over the batch)."""
    logits, cache = model.forward(tokens)
    loss, _ = softmax_cross_entropy_forward(logits, targets)
    accuracy = float((logits.argmax(axis=-1) == targets).mean())
    return loss, accuracy, cache.attn_weights.mean(axis=0)


def one_blas_thread():
    """A context that runs NumPy's BLAS on one thread (when threadpoolctl is installed).

    The matrices here are tiny (B·L × E); several BLAS threads only add synchronisation, which on a
    busy machine makes training 10x slower or worse.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is in requirements.txt
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def train_step(
    model: TinyAttentionModel,
    opt: SGD | Adam,
    tokens: np.ndarray,
    targets: np.ndarray,
    max_grad_norm: float | None = None,
) -> tuple[float, np.ndarray, float]:
    """forward, loss, backward, clip, update: -> (loss, logits (B, L, V) before the update, gradient norm)."""
    loss, logits, grads, _ = model.loss_and_grads(tokens, targets)
    norm = global_norm(grads)  # before clipping, as clip_grad_norm_ reports it
    if max_grad_norm is not None:
        grads, _ = clip_grad_norm(grads, max_grad_norm)
    opt.step(grads)
    return loss, logits, norm


def train(
    task: str = "reverse",
    *,
    length: int = 8,
    vocab_size: int = 10,
    embed_dim: int = 32,
    num_heads: int = 1,
    steps: int = 300,
    batch_size: int = 64,
    optimizer: str = "adam",
    lr: float = 3e-3,
    momentum: float = 0.9,
    max_grad_norm: float | None = 1.0,
    shift: int = 1,
    seed: int = 0,
    log_every: int = 50,
    snapshot_steps: tuple[int, ...] | None = None,
    eval_size: int = 1000,
    log: Callable[[str], None] | None = print,
) -> TrainResult:
    """Train a ``TinyAttentionModel`` on a toy task with fresh random batches; print progress via ``log``.

    optimizer: "adam" or "sgd" (with ``momentum``). max_grad_norm: clip by global norm (None: no clipping).
    snapshot_steps: steps after which to store the attention maps (default: 0, i.e. before training,
    and after 5%, 15%, 40% and 100% of the steps). The seed fixes the initial weights, every batch
    and the held-out evaluation batch (``eval_size`` sequences) behind ``accuracy`` and the maps.
    """
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    seq_init, seq_data, seq_eval = np.random.SeedSequence(seed).spawn(3)
    data_rng = np.random.default_rng(seq_data)
    model = TinyAttentionModel(vocab_size, length, embed_dim, num_heads, rng=np.random.default_rng(seq_init))
    opt = Adam(model.params, lr=lr) if optimizer == "adam" else SGD(model.params, lr=lr, momentum=momentum)
    eval_tokens, eval_targets = make_batch(task, np.random.default_rng(seq_eval), eval_size, length, vocab_size, shift)
    if snapshot_steps is None:
        snapshot_steps = tuple(sorted({0, *(int(round(steps * f)) for f in (0.05, 0.15, 0.4, 1.0))}))
    history: dict[str, list] = {"step": [], "loss": [], "accuracy": [], "grad_norm": []}
    snapshots: dict[int, np.ndarray] = {}

    with one_blas_thread():
        if 0 in snapshot_steps:
            snapshots[0] = evaluate(model, eval_tokens, eval_targets)[2]
        for step in range(1, steps + 1):
            tokens, targets = make_batch(task, data_rng, batch_size, length, vocab_size, shift)
            loss, logits, norm = train_step(model, opt, tokens, targets, max_grad_norm)
            accuracy = float((logits.argmax(axis=-1) == targets).mean())  # before this step's update
            for key, value in zip(history, (step, loss, accuracy, norm)):
                history[key].append(value)
            if step in snapshot_steps:
                snapshots[step] = evaluate(model, eval_tokens, eval_targets)[2]
            if log is not None and (step % log_every == 0 or step in (1, steps)):
                log(f"step {step:5d}  loss {loss:.4f}  accuracy {accuracy:.3f}  grad norm {norm:.3f}")
        _, accuracy, attention = evaluate(model, eval_tokens, eval_targets)

    config = dict(
        task=task, length=length, vocab_size=vocab_size, embed_dim=embed_dim, num_heads=num_heads, steps=steps,
        batch_size=batch_size, optimizer=optimizer, lr=lr, max_grad_norm=max_grad_norm, shift=shift, seed=seed,
    )  # fmt: skip
    ideal = ideal_attention(task, length, shift)
    return TrainResult(model, task, history, attention, snapshots, accuracy, ideal, config)
