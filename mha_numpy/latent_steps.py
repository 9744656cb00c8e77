"""The data path of multi-head latent attention (MLA, DeepSeek-V2 and V3) as data: its options, its own steps, and
its builder. The steps from the attention kernel on are ``steps.py``'s (``Attend``, ``Merge``, ``OutProject``).

    QueryProject   q = query W_qᵀ, or through a low-rank latent: rms_norm(query W_qaᵀ + b_qa) W_qbᵀ    (B, Lq, H·dqk)
    LatentProject  [c_kv | k_rope] = key W_kvaᵀ + b_kva, c_kv = rms_norm(c_kv)    (B, Lk, r), (B, 1, Lk, dr)
    SplitQuery     Q (B, H, Lq, dqk), each head's query [nope | rope]
    DecoupledRope  Q's last dr features and the one rope key turned by their positions (RoPE)
    [AppendLatent] c_kv and k_rope appended to the LatentCache (not K and V): (B, 1, cached + Lk, r + dr)
    Expand         [K_nope | V] = c_kv W_kvbᵀ per head; K = [K_nope | k_rope], k_rope shared by every head
    Attend         context = softmax(Q Kᵀ · scale + mask) V, by the kernel    (B, H, Lq, dv)
    Merge          merged (B, Lq, H·dv)
    OutProject     output = merged W_oᵀ + b_o    (B, Lq, E)

E = embed_dim, H = num_heads, r = kv_lora_rank, rq = q_lora_rank, dn = qk_nope_head_dim, dr = qk_rope_head_dim,
dqk = dn + dr (the query/key head dim), dv = v_head_dim (the value head dim, dv ≠ dqk in general).

Only c_kv and k_rope depend on the keys' tokens before the expansion, so they are all a decoder has to keep: r + dr
numbers a token (576 in DeepSeek-V3) instead of H · (dqk + dv) (40960). The rope part is "decoupled" because RoPE
cannot pass through W_kvb: a rotation between the latent and the key would depend on the key's position and could
not be stored once; so the keys' positional part is a separate, shared head of dr features (docs/derivation.md, § 25).

The steps follow ``steps.py``'s protocol (``forward(f, s)`` / ``backward(g, s)`` on a ``flow.Flow``, parameters
declared with ``steps.Param``); ``recompute=True`` runs one head at a time: W_q, W_qb, W_kvb (rows) and W_o
(columns) are cut per head, the latent projections and their norms are shared (each head's group recomputes them
and the groups' gradients add up).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from . import functional as F
from ._checks import as_int, as_number
from .kv_cache import LatentCache, StreamingKVCache
from .steps import AppendToCache, AttentionConfig, Option, Param, Rope, Step, build_steps

# --------------------------------------------------------------------------- the options (declared on the steps)


def _latent_size(value, name, o):
    """kv_lora_rank's companions: required (a positive int) with kv_lora_rank, refused without it."""
    if o["kv_lora_rank"] is None:
        if value is not None:
            raise ValueError(f"{name} is an option of latent attention: give kv_lora_rank too")
        return None
    n = as_int(value, name, minimum=1) if value is not None else None
    if n is None:
        raise ValueError(f"latent attention (kv_lora_rank) needs {name}, a positive int")
    if name == "qk_rope_head_dim" and n % 2:
        raise ValueError(f"qk_rope_head_dim must be even (RoPE turns pairs of features), got {n}")
    return n


def _q_lora_rank(value, name, o):
    if value is not None and o["kv_lora_rank"] is None:
        raise ValueError("q_lora_rank is an option of latent attention: give kv_lora_rank too")
    return None if value is None else as_int(value, name, minimum=1)


def LatentConfig(embed_dim, num_heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, q_lora_rank=None,
                 bias=False, rope_theta=10000.0, **options):  # fmt: skip
    """Deprecated (0.4): MLA's options are ``steps.AttentionConfig``'s; this makes one with 0.3's defaults."""
    warnings.warn("latent_steps.LatentConfig is deprecated: use steps.AttentionConfig(..., kv_lora_rank=...)",
                  DeprecationWarning, stacklevel=2)  # fmt: skip
    sizes = dict(kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim, qk_nope_head_dim=qk_nope_head_dim,
                 v_head_dim=v_head_dim, q_lora_rank=q_lora_rank)  # fmt: skip
    return AttentionConfig(embed_dim, num_heads, bias=bias, rope_theta=rope_theta, **sizes, **options)


def build_latent_steps(c, kv_cache: bool = False):
    """Deprecated (0.4): ``steps.build_steps`` builds MLA's steps too."""
    warnings.warn("latent_steps.build_latent_steps is deprecated: use steps.build_steps", DeprecationWarning, 2)
    return build_steps(c, kv_cache)


def _linear_init(shape):
    """torch's nn.Linear default: U(±1/√fan_in)."""
    bound = 1.0 / math.sqrt(shape[1])
    return lambda rng, dtype: rng.uniform(-bound, bound, size=shape).astype(dtype)


def _ones(n):
    return lambda rng, dtype: np.ones(n, dtype=dtype)


def _zeros(n):
    return lambda rng, dtype: np.zeros(n, dtype=dtype)


# --------------------------------------------------------------------------- the steps


class QueryProject(Step):
    """q = query W_qᵀ, or through the low-rank latent c_q: q = rms_norm(query W_qaᵀ + b_qa) W_qbᵀ (q_lora_rank)."""

    reads, writes = ("query",), ("q",)

    names = ("q_proj", "q_a_proj", "q_a_norm", "q_b_proj")
    place, family = 10, "latent"
    options = {"q_lora_rank": Option(None, _q_lora_rank, requires="kv_lora_rank")}  # rq; None: one projection W_q

    def params(self):
        """W_q (H·dqk, E), or W_qa, q_a_norm, W_qb (and b_qa) through the query's latent."""
        c = self.c
        E, Eq, rq = c.embed_dim, c.q_dim, c.q_lora_rank
        if rq is None:
            return {"W_q": Param((Eq, E), "q", init=_linear_init((Eq, E)), rank=0)}  # rows: head h's dqk
        out = {
            "W_qa": Param((rq, E), None, init=_linear_init((rq, E)), rank=0),  # shared: every head reads c_q
            "W_qb": Param((Eq, rq), "q", init=_linear_init((Eq, rq)), rank=0),
            "q_a_norm": Param((rq,), None, init=_ones(rq)),
        }
        if c.bias:
            out["b_qa"] = Param((rq,), None, init=_zeros(rq), rank=1)
        return out

    def forward(self, f, s):
        """q (B, Lq, H·dqk) from the query, directly or through its normalised latent."""
        P, mm, c = f.P, f.matmul, self.c
        if c.q_lora_rank is None:
            f.q, s["q_proj"] = F.linear_forward(f.query, P["W_q"], None, mm, check=False)  # F0: (B, Lq, H·dqk)
            return
        c_q, s["q_a_proj"] = F.linear_forward(f.query, P["W_qa"], P.get("b_qa"), mm, check=False)  # F1: (B, Lq, rq)
        c_q, s["q_a_norm"] = F.rms_norm_forward(c_q, P["q_a_norm"], c.norm_eps, check=False)  # F2: (B, Lq, rq)
        f.q, s["q_b_proj"] = F.linear_forward(c_q, P["W_qb"], None, mm, check=False)  # F3: (B, Lq, H·dqk)

    def backward(self, g, s):
        """← F3 ... F1: the query's gradient and the projections'."""
        G, mm = g.P, g.matmul
        if "q_proj" in s:
            g.query, G["W_q"], _ = F.linear_backward(g.q, s["q_proj"], mm)  # ← F0: (B, Lq, E)
            return
        d_cq, G["W_qb"], _ = F.linear_backward(g.q, s["q_b_proj"], mm)  # ← F3: (B, Lq, rq)
        d_cq, G["q_a_norm"] = F.rms_norm_backward(d_cq, s["q_a_norm"])  # ← F2
        g.query, G["W_qa"], G["b_qa"] = F.linear_backward(d_cq, s["q_a_proj"], mm)  # ← F1: (B, Lq, E)


class LatentProject(Step):
    """[c_kv | k_rope] = key W_kvaᵀ + b_kva, c_kv = rms_norm(c_kv): the keys' and values' latent, and the rope key."""

    reads, writes = ("key",), ("latent", "k_rope")

    names = ("kv_a_proj", "kv_a_split", "kv_a_norm")
    place, family = 12, "latent"
    options = {
        "kv_lora_rank": Option(
            None,
            lambda v, n, o: None if v is None else as_int(v, n, minimum=1),
            example=dict(
                kv_lora_rank=3, qk_rope_head_dim=2, qk_nope_head_dim=2, v_head_dim=3, q_lora_rank=3, rope_theta=50.0
            ),
        ),  # r: MLA  # fmt: skip
        "qk_rope_head_dim": Option(None, _latent_size, requires="kv_lora_rank"),  # dr, even
        "qk_nope_head_dim": Option(None, _latent_size, requires="kv_lora_rank"),  # dn
        "v_head_dim": Option(None, _latent_size, requires="kv_lora_rank"),  # dv
        "norm_eps": Option(1e-6, lambda v, n, o: as_number(v, n, positive=True), requires="kv_lora_rank"),  # both norms
    }

    def params(self):
        """W_kva (r + dr, kdim), kv_a_norm (r,), and b_kva with bias."""
        c = self.c
        r, n = c.kv_lora_rank, c.kv_lora_rank + c.qk_rope_head_dim  # shared by every head: groups add gradients
        shape = (n, c.kdim)  # the key's features (E unless kdim is given)
        out = {
            "W_kva": Param(shape, None, init=_linear_init(shape), rank=0),
            "kv_a_norm": Param((r,), None, init=_ones(r)),
        }
        if c.bias:
            out["b_kva"] = Param((n,), None, init=_zeros(n), rank=1)
        return out

    def forward(self, f, s):
        """The normalised latent c_kv (B, Lk, r) and the one rope key (B, 1, Lk, dr)."""
        P, c = f.P, self.c
        a, s["kv_a_proj"] = F.linear_forward(f.key, P["W_kva"], P.get("b_kva"), f.matmul, check=False)  # F1
        sizes = (c.kv_lora_rank, c.qk_rope_head_dim)  # a: (B, Lk, r + dr)
        (latent, k_rope), s["kv_a_split"] = F.split_features_forward(a, sizes, check=False)  # F2: (B, Lk, r), (.., dr)
        f.latent, s["kv_a_norm"] = F.rms_norm_forward(latent, P["kv_a_norm"], c.norm_eps, check=False)  # F3
        f.k_rope = k_rope[:, None]  # F4: (B, 1, Lk, dr), a view: one head, read by every head

    def backward(self, g, s):
        """← F3 ... F1: the key's gradient and W_kva's, kv_a_norm's, b_kva's."""
        d_latent, g.P["kv_a_norm"] = F.rms_norm_backward(g.latent, s["kv_a_norm"])  # ← F3: (B, Lk, r)
        d_a = F.split_features_backward([d_latent, g.k_rope[:, 0]], s["kv_a_split"])  # ← F4, F2: (B, Lk, r + dr)
        g.key, g.P["W_kva"], g.P["b_kva"] = F.linear_backward(d_a, s["kv_a_proj"], g.matmul)  # ← F1: (B, Lk, E)


class SplitQuery(Step):
    """Q (B, H, Lq, dqk): head h reads features h·dqk ... (h+1)·dqk - 1 of q, each [nope | rope]."""

    reads, writes = ("q",), ("Q",)

    names = ("q_split",)
    place, family = 20, "latent"

    def forward(self, f, s):
        """Q (B, H, Lq, dqk) from q."""
        f.Q, s["q_split"] = F.split_heads_forward(f.q, f.H, check=False)  # F1: (B, H, Lq, dqk)

    def backward(self, g, s):
        """← F1: q's gradient from Q's."""
        g.q = F.split_heads_backward(g.Q, s["q_split"])  # ← F1: (B, Lq, H·dqk)


class DecoupledRope(Rope):
    """RoPE on the last dr features of each query head and on the one rope key; the nope features stay unturned.

    positions= are checked as ``Rope`` checks them (its ``check``)."""

    reads, writes = ("Q", "k_rope"), ("Q", "k_rope")

    option = None  # always in MLA's data path
    names = ("q_rope_split", "q_rope", "q_rope_join", "k_rope")
    place, family = 40, "latent"
    # rope_interleave is Rope's option (declared once), True by default here: DeepSeek's layout

    def turn(self, x, positions, table):
        """x turned by the call's table (``Rope.table`` of the dr rope features) in the config's layout: pairs
        (0, 1), (2, 3), ... gathered into halves as DeepSeek's (``rope_interleave``), or (i, i + dr/2)."""
        inv_freq, factor = table
        if self.c.rope_interleave:
            return F.rope_interleaved_forward(x, positions, inv_freq=inv_freq, attention_factor=factor, check=False)
        return F.rotary_forward(x, positions, inv_freq, factor, check=False)

    def turn_back(self, d_out, cache):
        """The inverse rotation of ``turn``'s layout."""
        return (F.rope_interleaved_backward if self.c.rope_interleave else F.rotary_backward)(d_out, cache)

    def forward(self, f, s):
        """The rope part of each query head and the rope key turned at their positions."""
        c = self.c
        table = self.table(f, head_dim=c.qk_rope_head_dim, partial_rotary_factor=1.0)  # (dr/2,), attention factor
        sizes = (c.qk_nope_head_dim, c.qk_rope_head_dim)
        (Q_nope, Q_rope), s["q_rope_split"] = F.split_features_forward(f.Q, sizes, check=False)  # F1: (B, H, Lq, ·)
        Q_rope, s["q_rope"] = self.turn(Q_rope, f.pos_q, table)  # F2: (B, H, Lq, dr)
        f.Q, s["q_rope_join"] = F.concat_features_forward(Q_nope, Q_rope)  # F3: (B, H, Lq, dqk)
        f.k_rope, s["k_rope"] = self.turn(f.k_rope, f.pos_k, table)  # F4: (B, 1, Lk, dr)

    def backward(self, g, s):
        """← F4 ... F1: the inverse rotations."""
        rope_backward = self.turn_back
        g.k_rope = rope_backward(g.k_rope, s["k_rope"])  # ← F4: the inverse rotation
        dQ_nope, dQ_rope = F.concat_features_backward(g.Q, s["q_rope_join"])  # ← F3
        dQ_rope = rope_backward(dQ_rope, s["q_rope"])  # ← F2
        g.Q = F.split_features_backward([dQ_nope, dQ_rope], s["q_rope_split"])  # ← F1: (B, H, Lq, dqk)


class AppendLatent(AppendToCache):
    """c_kv and k_rope appended to the LatentCache (not K and V); the queries see every cached position, causally.

    ``AppendToCache``'s check, causal mask and refusals; only what is stored differs."""

    reads, writes = ("latent", "k_rope", "args"), ("latent", "k_rope", "args")

    cache_type = (LatentCache, StreamingKVCache)  # a StreamingKVCache keeps the latents of its sinks and window
    place, family = 45, "latent"
    not_groupwise = "decoding keeps every position's latent for every head, recompute keeps none"

    def store(self, f):
        """c_kv and the rope key into the cache -> the number of positions the queries see."""
        latent, f.k_rope = f.kv_cache.append(f.latent[:, None], f.k_rope)  # (B, 1, cached + Lk, r), (.., dr)
        f.latent = latent[:, 0]  # (B, cached + Lk, r): every position so far
        return f.latent.shape[1]


class Expand(Step):
    """[K_nope | V] = c_kv W_kvbᵀ, cut per head; K = [K_nope | k_rope], the rope key shared by every head."""

    reads, writes = ("latent", "k_rope"), ("K", "V", "K_heads", "V_heads")

    names = ("kv_b_proj", "kv_split", "kv_b_split", "k_join")
    place, family = 48, "latent"

    def params(self):
        """W_kvb (H·(dn + dv), r): every head's nope key and value from the latent."""
        c = self.c
        shape = (c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)  # rows: head h's dn + dv
        return {"W_kvb": Param(shape, "q", init=_linear_init(shape), rank=0)}

    def forward(self, f, s):
        """K (B, H, Lk, dqk) = [c_kv W_kvb's nope part | k_rope], V (B, H, Lk, dv)."""
        c = self.c
        kv, s["kv_b_proj"] = F.linear_forward(f.latent, f.P["W_kvb"], None, f.matmul, check=False)  # F1: (B, Lk, ·)
        KV, s["kv_split"] = F.split_heads_forward(kv, f.H, check=False)  # F2: (B, H, Lk, dn + dv)
        sizes = (c.qk_nope_head_dim, c.v_head_dim)
        (K_nope, f.V), s["kv_b_split"] = F.split_features_forward(KV, sizes, check=False)  # F3: (.., dn), (.., dv)
        f.K, s["k_join"] = F.concat_features_forward(K_nope, f.k_rope)  # F4: (B, H, Lk, dqk)
        f.K_heads, f.V_heads = f.K, f.V  # every query head has its own key and value head

    def backward(self, g, s):
        """← F4 ... F1: the latent's and the rope key's gradients (the rope key's summed over heads), W_kvb's."""
        dK_nope, g.k_rope = F.concat_features_backward(g.K_heads, s["k_join"])  # ← F4: k_rope's summed over heads
        dKV = F.split_features_backward([dK_nope, g.V_heads], s["kv_b_split"])  # ← F3: (B, H, Lk, dn + dv)
        d_kv = F.split_heads_backward(dKV, s["kv_split"])  # ← F2: (B, Lk, H·(dn + dv))
        g.latent, g.P["W_kvb"], _ = F.linear_backward(d_kv, s["kv_b_proj"], g.matmul)  # ← F1: (B, Lk, r)
