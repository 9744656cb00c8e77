"""Solutions to exercises/ex02_heads.ipynb."""


def split_heads_forward(x, num_heads):
    B, L, E = x.shape
    d = E // num_heads
    heads = x.reshape(B, L, num_heads, d).transpose(0, 2, 1, 3)  # (B, L, H, d) -> (B, H, L, d)
    return heads, x.shape


def split_heads_backward(d_out, cache):
    return d_out.transpose(0, 2, 1, 3).reshape(cache)  # (B, H, L, d) -> (B, L, H, d) -> (B, L, E)


def merge_heads_forward(x):
    B, H, L, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, H * d), x.shape  # (B, L, H, d) -> (B, L, E)


def merge_heads_backward(d_out, cache):
    B, H, L, d = cache
    return d_out.reshape(B, L, H, d).transpose(0, 2, 1, 3)  # (B, L, H, d) -> (B, H, L, d)
