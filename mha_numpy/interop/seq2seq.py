"""The encoder–decoder of ``models.seq2seq`` against the same model in torch: ``torch.nn.Transformer`` with four
``nn.Embedding`` and an ``nn.Linear``, from the same weights.

    from mha_numpy.models.seq2seq import Seq2SeqModel, Seq2SeqConfig, reverse_batch
    from mha_numpy.interop.seq2seq import crosscheck_seq2seq
    model = Seq2SeqModel.random(Seq2SeqConfig())
    src, tgt_in, labels = reverse_batch(np.random.default_rng(0), 4, 8, 11)
    print(crosscheck_seq2seq(model, src, tgt_in, labels))   # logits, loss, every gradient, the greedy decoding

torch's side is ``nn.Transformer(norm_first=True, activation="gelu", dropout=0.0, batch_first=True)``: its layers
are pre-norm as ours, its attention ``nn.MultiheadAttention`` (W_q, W_k, W_v packed in ``in_proj_weight``: the rows
of ``names.torch_mha_name_map``), its GELU the exact (erf) one. The loss is ``F.cross_entropy`` (the mean over
tokens) and the gradients are autograd's. torch's greedy decoding has no cache: each step runs the decoder on the
whole prefix with the causal mask, so it checks our cached decoding (KVCache + cross-attention K, V projected once)
against the plain computation. The module stays in training mode, which with dropout 0 computes the same thing and
keeps torch on its plain path (the "fast path" of ``nn.TransformerEncoderLayer`` needs eval mode). torch is
imported lazily.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..models.seq2seq import BOS, Seq2SeqModel
from . import CrosscheckReport, names
from ._lazy import require
from .harness import Row, compare, grad_rows, our_grads, theirs_grads

SEQ2SEQ_RTOL = 1e-12  # float64: every row, max |ours - torch| / max |torch|


def torch_name_map(model: Seq2SeqModel) -> dict[str, tuple[str, slice | None]]:
    """Our parameter name -> (the torch model's state-dict name, its rows, or None for the whole tensor).

    The names are torch's but for the attention projections: ours ``...self_attn.W_q`` is torch's
    ``transformer....self_attn.in_proj_weight`` rows 0:E (``names.torch_mha_name_map``); the encoder's and the
    decoder's tensors sit under ``transformer.`` in torch."""
    attn = names.torch_mha_name_map(model.config.d_model)  # W_q -> ("in_proj_weight", 0:E), ..., b_o -> out_proj.bias
    name_map = {}
    for name in model.params:
        module, _, role = name.rpartition(".")
        if role in attn and module.endswith(("self_attn", "multihead_attn")):  # an attention projection
            tname, rows = attn[role]
            name_map[name] = (f"transformer.{module}.{tname}", rows)
        elif name.startswith(("encoder.", "decoder.")):
            name_map[name] = (f"transformer.{name}", None)  # norms, linear1/2, the final norms
        else:
            name_map[name] = (name, None)  # the embeddings and the generator
    return name_map


def _transformer(nn, c):
    """``nn.Transformer`` as ours: pre-norm, exact GELU, no dropout, batch first."""
    with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first was True"
        warnings.simplefilter("ignore", UserWarning)
        return nn.Transformer(
            c.d_model, c.nhead, c.num_encoder_layers, c.num_decoder_layers, c.dim_feedforward, dropout=0.0,
            activation="gelu", layer_norm_eps=c.layer_norm_eps, batch_first=True, norm_first=True,
        )  # fmt: skip


def _twin_class(torch):
    """The torch twin's class (torch is imported lazily, so the class is made on first use)."""
    nn = torch.nn

    class TorchSeq2Seq(nn.Module):
        def __init__(self, c, dtype):
            super().__init__()
            E, V, self.dtype = c.d_model, c.vocab_size, dtype
            self.src_embed, self.tgt_embed = nn.Embedding(V, E), nn.Embedding(V, E)
            self.src_pos, self.tgt_pos = nn.Embedding(c.max_len, E), nn.Embedding(c.max_len, E)
            self.transformer = _transformer(nn, c)
            self.generator = nn.Linear(E, V)

        def embed(self, ids, side):
            positions = torch.arange(ids.shape[1])
            return getattr(self, f"{side}_embed")(ids) + getattr(self, f"{side}_pos")(positions)

        def encode(self, src):
            """memory (B, Ls, E). No encoder layer: the final norm alone (torch's encoder reads layers[0])."""
            encoder, s = self.transformer.encoder, self.embed(src, "src")
            return encoder(s) if len(encoder.layers) else encoder.norm(s)

        def decode(self, tgt_in, memory):
            L = tgt_in.shape[1]
            causal = nn.Transformer.generate_square_subsequent_mask(L, dtype=self.dtype)  # -inf above the diagonal
            x = self.transformer.decoder(self.embed(tgt_in, "tgt"), memory, tgt_mask=causal, tgt_is_causal=True)
            return self.generator(x)  # (B, Lt, V); the decoder ends with its norm

        def forward(self, src, tgt_in):
            return self.decode(tgt_in, self.encode(src))

        def greedy_decode(self, src, length, bos=BOS):
            """-> tokens (B, length), logits (B, length, V): the whole prefix through the decoder at every step."""
            return _greedy_decode(torch, self, src, length, bos)

    return TorchSeq2Seq


def _greedy_decode(torch, twin, src, length: int, bos: int):
    """The twin's greedy decoding without a cache: the whole prefix through the decoder at every step."""
    memory = twin.encode(src)
    prefix, logits = torch.full((src.shape[0], 1), bos, dtype=torch.long), []
    for _ in range(length):
        step = twin.decode(prefix, memory)[:, -1:]  # (B, 1, V): the newest position's
        logits.append(step)
        prefix = torch.cat([prefix, step.argmax(-1)], dim=1)
    return prefix[:, 1:], torch.cat(logits, dim=1)


def to_torch_seq2seq(model: Seq2SeqModel):
    """A torch module (``.forward(src, tgt_in) -> logits``, ``.greedy_decode(src, length)``) with copies of
    ``model``'s weights, in its dtype."""
    torch = require("torch")
    dtype = getattr(torch, model.dtype.name)
    twin = _twin_class(torch)(model.config, dtype).to(dtype)
    state, name_map = dict(twin.named_parameters()), torch_name_map(model)
    with torch.no_grad():
        for name, (tname, rows) in name_map.items():
            target = state[tname] if rows is None else state[tname][rows]
            if tuple(target.shape) != model.params[name].shape:
                raise ValueError(
                    f"{name} {model.params[name].shape} does not fit torch's {tname} {tuple(target.shape)}"
                )
            target.copy_(torch.from_numpy(np.ascontiguousarray(model.params[name])))
    covered = {tname for tname, _ in name_map.values()}
    if covered != set(state):
        raise ValueError(f"torch parameters without a counterpart: {sorted(set(state) - covered)}")
    return twin.train()  # dropout 0: the same function, and torch's plain (not fast) path


def _grad_label(entry) -> str:
    """Where a gradient row's torch number comes from: the end of torch's name (and its rows), ``.grad``."""
    tname, rows = entry
    return ".".join(tname.split(".")[-2:]) + ("" if rows is None else f"[{rows.start}:{rows.stop}]") + ".grad"


def crosscheck_seq2seq(model: Seq2SeqModel, src, tgt_in, labels, decode_length: int | None = None,
                       rtol: float | None = None) -> CrosscheckReport:  # fmt: skip
    """Ours against torch on the same weights: the logits, the loss, the gradient of every parameter (autograd of
    the mean cross-entropy), and the greedy decoding of ``src`` for ``decode_length`` tokens (default
    labels' length): the tokens and every step's logits. rtol: default ``SEQ2SEQ_RTOL`` (float64)."""
    torch = require("torch")
    rtol = SEQ2SEQ_RTOL if rtol is None else float(rtol)
    src, tgt_in, labels = (np.asarray(a) for a in (src, tgt_in, labels))
    decode_length = labels.shape[1] if decode_length is None else decode_length
    twin, name_map = to_torch_seq2seq(model), torch_name_map(model)
    loss, out, grads = model.loss_and_grads(src, tgt_in, labels)
    decoded = model.greedy_decode(src, decode_length)
    ours = {"logits": out.logits, "loss": loss, "tokens": decoded.tokens, "greedy": decoded.logits, **our_grads(grads)}
    theirs = _torch_side(torch, twin, src, tgt_in, labels, decode_length, name_map)
    same = bool((ours["tokens"] == theirs["tokens"]).all())
    rows = (
        Row("logits", "TorchSeq2Seq(src, tgt_in)", "logits"),
        Row("loss", "F.cross_entropy", "loss"),
        *grad_rows(name_map, "d {}", _grad_label),
        Row("greedy logits (cached)", "whole prefix every step", "greedy"),
        Row("greedy tokens", "argmax, whole prefix", "tokens", note="" if same else "the decoded tokens differ"),
    )
    n = min(decode_length, labels.shape[1])  # the decoded tokens that have a label
    exact = [float((tok[:, :n] == labels[:, :n]).all(axis=1).mean()) for tok in (ours["tokens"], theirs["tokens"])]
    note = f"loss {loss:.6f}; sequences decoded as their labels: ours {exact[0]:.3f}, torch {exact[1]:.3f}"
    title = "Seq2SeqModel vs torch.nn.Transformer (norm_first, gelu) + embeddings"
    return compare(title, model.dtype, rtol, rows, ours, theirs, [note])


def _torch_side(torch, twin, src, tgt_in, labels, decode_length: int, name_map) -> dict:
    """The twin's logits, mean cross-entropy and its gradients (autograd, read as ours through ``name_map``), and its
    greedy decoding (tokens and every step's logits)."""
    logits = twin(torch.from_numpy(src), torch.from_numpy(tgt_in))  # (B, Lt, V)
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.from_numpy(labels).reshape(-1))
    loss.backward()
    grads = {name: p.grad for name, p in twin.named_parameters()}
    with torch.no_grad():
        tokens, greedy = twin.greedy_decode(torch.from_numpy(src), decode_length)
    theirs = {
        "logits": logits.detach().numpy(),
        "loss": loss.item(),
        "tokens": tokens.numpy(),
        "greedy": greedy.numpy(),
    }
    return {**theirs, **theirs_grads(grads, name_map)}
