"""A student's cross-entropy without the 1/N, forward and backward."""

# expect: softmax_cross_entropy_forward cross_entropy_sum
# expect: softmax_cross_entropy_backward cross_entropy_no_mean
import numpy as np


def softmax_cross_entropy_forward(logits, targets):
    z = logits - logits.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    loss = -np.take_along_axis(log_p, targets[..., None], axis=-1).sum()
    return loss, (np.exp(log_p), targets)


def softmax_cross_entropy_backward(d_loss, cache):
    p, targets = cache
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, targets[..., None], 1.0, axis=-1)
    return (p - onehot) * d_loss
