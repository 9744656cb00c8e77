"""A student's FlashAttention forward that rescales the wrong way round."""

# expect: flash_attention_forward flash_rescale_inverted
import numpy as np


def flash_attention_forward(q, k, v, mask, block):
    scale = 1.0 / np.sqrt(q.shape[-1])
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    if mask is not None:
        mask = np.broadcast_to(mask, (B, H, Lq, Lk))
    m = np.full((B, H, Lq, 1), -np.inf)
    l = np.zeros((B, H, Lq, 1))  # noqa: E741 - ℓ, as in the notebook
    acc = np.zeros((B, H, Lq, v.shape[-1]))
    for j in range(0, Lk, block):
        s = (q @ k[:, :, j : j + block].swapaxes(-1, -2)) * scale  # (B, H, Lq, bk)
        if mask is not None:
            s = np.where(mask[..., j : j + block], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(m_new), m_new, 0.0)  # a row that has seen only -inf
        alpha = np.exp(shift - m)
        e = np.exp(s - shift)
        l = alpha * l + e.sum(axis=-1, keepdims=True)  # noqa: E741
        acc = alpha * acc + e @ v[:, :, j : j + block]
        m = m_new
    inv_l = np.where(l > 0, 1.0 / np.where(l > 0, l, 1.0), 0.0)  # 0 for a row with no key allowed
    o = acc * inv_l
    m = np.where(np.isfinite(m), m, 0.0)
    return o, (q, k, v, mask, o, m, inv_l, block)
