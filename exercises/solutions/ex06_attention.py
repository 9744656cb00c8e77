"""Solutions to exercises/ex06_attention.ipynb."""

import numpy as np

from mha_numpy import functional as F


def scaled_dot_product_attention_forward(q, k, v, mask=None):
    scale = 1.0 / np.sqrt(q.shape[-1])
    S, c1 = F.attention_scores_forward(q, k, scale)  # (B, H, Lq, Lk)
    S, c2 = F.apply_mask_forward(S, mask)
    P, c3 = F.softmax_forward(S)
    out, c4 = F.attention_context_forward(P, v)  # (B, H, Lq, dv)
    return out, (c1, c2, c3, c4)


def scaled_dot_product_attention_backward(d_out, cache):
    c1, c2, c3, c4 = cache
    dP, dv = F.attention_context_backward(d_out, c4)
    dS = F.apply_mask_backward(F.softmax_backward(dP, c3), c2)
    dq, dk = F.attention_scores_backward(dS, c1)
    return dq, dk, dv


def self_attention_forward(x, params, num_heads, mask=None):
    P = params
    q, cq = F.linear_forward(x, P["W_q"], P["b_q"])
    k, ck = F.linear_forward(x, P["W_k"], P["b_k"])
    v, cv = F.linear_forward(x, P["W_v"], P["b_v"])
    (q, sq), (k, sk), (v, sv) = (F.split_heads_forward(t, num_heads) for t in (q, k, v))
    ctx, ca = scaled_dot_product_attention_forward(q, k, v, mask)
    merged, cm = F.merge_heads_forward(ctx)
    out, co = F.linear_forward(merged, P["W_o"], P["b_o"])
    return out, (cq, ck, cv, sq, sk, sv, ca, cm, co)


def self_attention_backward(d_out, cache):
    cq, ck, cv, sq, sk, sv, ca, cm, co = cache
    g = {}
    d_merged, g["W_o"], g["b_o"] = F.linear_backward(d_out, co)
    dq, dk, dv = scaled_dot_product_attention_backward(F.merge_heads_backward(d_merged, cm), ca)
    dxq, g["W_q"], g["b_q"] = F.linear_backward(F.split_heads_backward(dq, sq), cq)
    dxk, g["W_k"], g["b_k"] = F.linear_backward(F.split_heads_backward(dk, sk), ck)
    dxv, g["W_v"], g["b_v"] = F.linear_backward(F.split_heads_backward(dv, sv), cv)
    g["x"] = dxq + dxk + dxv  # x is query, key and value: the three paths add up
    return g
