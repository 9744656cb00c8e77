"""Regenerate tests/data/torch_reference.npz: PyTorch's (and transformers') numbers for fixed inputs.

    python scripts/make_torch_reference.py [--out tests/data/torch_reference.npz]

The fixture lets tests/test_crosscheck_reference.py check mha_numpy against PyTorch where torch is not
installed. This script uses torch and transformers directly, never mha_numpy, so the stored numbers are
independent of our code: weights are stored under torch's own state-dict names (``in_proj_weight``,
``self.query.weight``, ...), masks in each framework's own convention, inputs batch first.

Every weight, input, mask and upstream gradient comes from NumPy's seeded generator, so a rerun with the
same torch version reproduces the file up to the last bit; a different torch version may move the last
bits of the outputs (the versions used are recorded under ``meta/``).

Layout: ``meta/...`` and one group per case, ``CASE/config`` (JSON), ``CASE/w/<torch name>``,
``CASE/in/<input or mask>``, ``CASE/d_output``, ``CASE/out/<output, attn_weights, grad/<name>>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

E, H = 8, 2


def _uniform(rng, shape, fan_in, dtype):
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, shape).astype(dtype)


# --------------------------------------------------------------------------- torch.nn.MultiheadAttention


def _mha_case(
    torch, rng, *, B, Lq, Lk, kdim, vdim, bias, batch_first, need_weights, dtype, masks, self_attention=False
):
    """One MHA run: weights under torch names, inputs batch first, masks in torch's convention (True = ignore)."""
    tdtype = getattr(torch, dtype)
    m = torch.nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first, dtype=tdtype)
    state = {}
    for name, p in m.state_dict().items():
        fan_in = p.shape[-1] if p.ndim == 2 else 1
        state[name] = _uniform(rng, tuple(p.shape), fan_in, dtype) if p.ndim == 2 else rng.normal(0, 0.5, p.shape)
        state[name] = state[name].astype(dtype)
    m.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    m.eval()
    kd, vd = kdim or E, vdim or E
    query = rng.standard_normal((B, Lq, E)).astype(dtype)
    key = query if self_attention else rng.standard_normal((B, Lk, kd)).astype(dtype)
    value = query if self_attention else rng.standard_normal((B, Lk, vd)).astype(dtype)
    d_output = rng.standard_normal((B, Lq, E)).astype(dtype)
    inputs = {"query": query} if self_attention else {"query": query, "key": key, "value": value}
    leaves = {n: torch.from_numpy(x).requires_grad_() for n, x in inputs.items()}
    q = leaves["query"]
    k, v = (q, q) if self_attention else (leaves["key"], leaves["value"])
    fed = [t if batch_first else t.transpose(0, 1) for t in (q, k, v)]
    tmasks = {n: torch.from_numpy(x) for n, x in masks.items()}
    out, w = m(*fed, **tmasks, need_weights=need_weights, average_attn_weights=False)
    out = out if batch_first else out.transpose(0, 1)
    params = dict(m.named_parameters())
    grads = torch.autograd.grad(out, [*leaves.values(), *params.values()], torch.from_numpy(d_output))
    results = {"output": out.detach().numpy()}
    if w is not None:
        results["attn_weights"] = w.detach().numpy()
    for name, g in zip([*leaves, *params], grads):
        results[f"grad/{name}"] = g.numpy()
    config = dict(
        kind="mha", E=E, H=H, kdim=kdim, vdim=vdim, bias=bias, batch_first=batch_first,
        need_weights=need_weights, dtype=dtype, self_attention=self_attention,
    )  # fmt: skip
    return config, state, {**inputs, **masks}, d_output, results


def _padding(lengths, Lk):
    return np.arange(Lk)[None, :] >= np.asarray(lengths)[:, None]  # (B, Lk) torch: True = ignore


def _future(Lq, Lk):
    return ~np.tril(np.ones((Lq, Lk), dtype=bool))  # (Lq, Lk) torch: True = ignore


# --------------------------------------------------------------------------- SDPA


def _sdpa_case(torch, rng, *, B, Lq, Lk, d, dv, dtype, attn_mask=None, is_causal=False):
    q = rng.standard_normal((B, H, Lq, d)).astype(dtype)
    k = rng.standard_normal((B, H, Lk, d)).astype(dtype)
    v = rng.standard_normal((B, H, Lk, dv)).astype(dtype)
    d_output = rng.standard_normal((B, H, Lq, dv)).astype(dtype)
    leaves = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    tm = None if attn_mask is None else torch.from_numpy(attn_mask)
    out = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=tm, is_causal=is_causal)
    grads = torch.autograd.grad(out, leaves, torch.from_numpy(d_output))
    inputs = {"q": q, "k": k, "v": v} | ({} if attn_mask is None else {"attn_mask": attn_mask})
    results = {"output": out.detach().numpy()} | {f"grad/{n}": g.numpy() for n, g in zip("qkv", grads)}
    return dict(kind="sdpa", is_causal=is_causal, dtype=dtype), {}, inputs, d_output, results


# --------------------------------------------------------------------------- HF BertAttention


def _hf_case(torch, rng, *, B, L, dtype, attention_mask):
    from transformers import BertConfig
    from transformers.masking_utils import create_bidirectional_mask
    from transformers.models.bert.modeling_bert import BertAttention

    cfg = BertConfig(
        hidden_size=E, num_attention_heads=H, intermediate_size=16, num_hidden_layers=1, vocab_size=16,
        attn_implementation="eager",
    )  # fmt: skip
    m = BertAttention(cfg).to(getattr(torch, dtype)).eval()
    state = {}
    for name, p in m.state_dict().items():
        if "LayerNorm" in name:
            state[name] = p.numpy().copy()  # not part of MHA; stored so the whole module is reproducible
        elif p.ndim == 2:
            state[name] = _uniform(rng, tuple(p.shape), p.shape[1], dtype)
        else:
            state[name] = rng.normal(0, 0.5, p.shape).astype(dtype)
    m.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    x = rng.standard_normal((B, L, E)).astype(dtype)
    d_output = rng.standard_normal((B, L, E)).astype(dtype)
    tx = torch.from_numpy(x).requires_grad_()
    ext = create_bidirectional_mask(config=cfg, inputs_embeds=tx, attention_mask=torch.from_numpy(attention_mask))
    context, w = m.self(tx, attention_mask=ext)
    out = m.output.dense(context)  # multi-head attention ends here; BertSelfOutput adds x and LayerNorms
    params = {n: p for n, p in m.named_parameters() if "LayerNorm" not in n}
    grads = torch.autograd.grad(out, [tx, *params.values()], torch.from_numpy(d_output))
    results = {"output": out.detach().numpy(), "attn_weights": w.detach().numpy()}
    results |= {f"grad/{n}": g.numpy() for n, g in zip(["hidden_states", *params], grads)}
    inputs = {"hidden_states": x, "attention_mask": attention_mask}
    return dict(kind="hf_bert", E=E, H=H, dtype=dtype), state, inputs, d_output, results


# --------------------------------------------------------------------------- all cases


def build() -> dict[str, np.ndarray]:
    import torch
    import transformers

    torch.set_num_threads(1)
    rng = np.random.default_rng(20261129)
    cases = {
        "mha_packed_padding": lambda: _mha_case(
            torch, rng, B=2, Lq=4, Lk=4, kdim=None, vdim=None, bias=True, batch_first=True, need_weights=True,
            dtype="float64", masks={"key_padding_mask": _padding([4, 2], 4)},
        ),
        "mha_kvdim_nobias_seqfirst_padding_causal": lambda: _mha_case(
            torch, rng, B=3, Lq=3, Lk=5, kdim=5, vdim=6, bias=False, batch_first=False, need_weights=False,
            dtype="float64", masks={"key_padding_mask": _padding([5, 4, 2], 5), "attn_mask": _future(3, 5)},
        ),
        "mha_float_masks_3d": lambda: _mha_case(
            torch, rng, B=2, Lq=3, Lk=4, kdim=None, vdim=None, bias=True, batch_first=True, need_weights=True,
            dtype="float64",
            masks={
                "key_padding_mask": np.where(_padding([4, 3], 4), -np.inf, 0.0),
                "attn_mask": np.where(_future(3, 4)[None], -np.inf, rng.normal(0, 1, (2 * H, 3, 4))),
            },
        ),
        "mha_self_attention_causal": lambda: _mha_case(
            torch, rng, B=2, Lq=4, Lk=4, kdim=None, vdim=None, bias=True, batch_first=True, need_weights=True,
            dtype="float64", masks={"attn_mask": _future(4, 4)}, self_attention=True,
        ),
        "mha_float32_kvdim_padding_causal": lambda: _mha_case(
            torch, rng, B=2, Lq=4, Lk=5, kdim=3, vdim=7, bias=True, batch_first=True, need_weights=True,
            dtype="float32", masks={"key_padding_mask": _padding([5, 3], 5), "attn_mask": _future(4, 5)},
        ),
        # query 2 may attend to nothing: torch 2.13's need_weights=True path gives NaN there
        "mha_fully_masked_row_need_weights": lambda: _mha_case(
            torch, rng, B=2, Lq=3, Lk=3, kdim=None, vdim=None, bias=True, batch_first=True, need_weights=True,
            dtype="float64", masks={"attn_mask": np.array([[0, 0, 1], [0, 0, 0], [1, 1, 1]], dtype=bool)},
        ),
        "mha_fully_masked_row_no_weights": lambda: _mha_case(
            torch, rng, B=2, Lq=3, Lk=3, kdim=None, vdim=None, bias=True, batch_first=True, need_weights=False,
            dtype="float64", masks={"attn_mask": np.array([[0, 0, 1], [0, 0, 0], [1, 1, 1]], dtype=bool)},
        ),
        "sdpa_bool_mask": lambda: _sdpa_case(
            torch, rng, B=2, Lq=3, Lk=5, d=4, dv=6, dtype="float64", attn_mask=rng.random((2, 1, 3, 5)) < 0.6
        ),
        "sdpa_float_mask": lambda: _sdpa_case(
            torch, rng, B=2, Lq=3, Lk=5, d=4, dv=4, dtype="float64", attn_mask=rng.normal(0, 1, (1, H, 3, 5))
        ),
        "sdpa_is_causal": lambda: _sdpa_case(torch, rng, B=2, Lq=3, Lk=5, d=4, dv=4, dtype="float64", is_causal=True),
        "sdpa_fully_masked_row": lambda: _sdpa_case(
            torch, rng, B=1, Lq=3, Lk=3, d=4, dv=4, dtype="float64",
            attn_mask=np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=bool),
        ),
        "hf_bert_padding": lambda: _hf_case(
            torch, rng, B=2, L=5, dtype="float64", attention_mask=np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
        ),
        "hf_bert_padding_float32": lambda: _hf_case(
            torch, rng, B=2, L=4, dtype="float32", attention_mask=np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
        ),
    }  # fmt: skip
    data = {
        "meta/torch_version": np.array(torch.__version__),
        "meta/transformers_version": np.array(transformers.__version__),
        "meta/numpy_version": np.array(np.__version__),
        "meta/cases": np.array(list(cases)),
        "meta/made_by": np.array("scripts/make_torch_reference.py"),
    }
    for case, make in cases.items():
        config, state, inputs, d_output, results = make()
        data[f"{case}/config"] = np.array(json.dumps(config))
        data |= {f"{case}/w/{k}": v for k, v in state.items()}
        data |= {f"{case}/in/{k}": v for k, v in inputs.items()}
        data[f"{case}/d_output"] = d_output
        data |= {f"{case}/out/{k}": v for k, v in results.items()}
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / "tests" / "data" / "torch_reference.npz"
    parser.add_argument("--out", type=Path, default=default, help="where to write (default %(default)s)")
    args = parser.parse_args(argv)
    data = build()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **data)
    size = args.out.stat().st_size / 1024
    print(f"wrote {args.out} ({size:.1f} KiB, {len(data)} arrays, torch {data['meta/torch_version']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
