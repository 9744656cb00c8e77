# expect: FAIL
# where: repeat_kv_backward x
# name: relation wrong-axis
"""Outside the catalogue: the forward caches (n_rep, Hkv) and the backward unpacks them the other way round, so its
reshape (B, n_rep, Hkv, L, d) is in truth (B, Hkv, n_rep, L, d) and its sum over axis 1 runs over the k/v heads
instead of the copies of each: the result has n_rep heads, not Hkv (right only when n_rep = Hkv)."""


def repeat_kv_forward(x, n_rep):
    return x.repeat(n_rep, axis=1), (n_rep, x.shape[1])


def repeat_kv_backward(d_out, cache):
    Hkv, n_rep = cache  # BUG: the forward stored (n_rep, Hkv)
    B, H, L, d = d_out.shape
    return d_out.reshape(B, n_rep, Hkv, L, d).sum(axis=1)
