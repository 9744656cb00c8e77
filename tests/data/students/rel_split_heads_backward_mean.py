"""A student's split_heads backward that divides by the number of heads ("each head gets its share")."""

# relation: split_heads_backward dx (in split_heads_backward) is 1/num_heads (= 0.5) times the right one


def split_heads_forward(x, num_heads):
    B, L, E = x.shape
    heads = x.reshape(B, L, num_heads, E // num_heads).transpose(0, 2, 1, 3)  # (B, L, H, d) -> (B, H, L, d)
    return heads, (x.shape, num_heads)


def split_heads_backward(d_out, cache):
    shape, num_heads = cache
    return d_out.transpose(0, 2, 1, 3).reshape(shape) / num_heads  # (B, H, L, d) -> (B, L, E), averaged
