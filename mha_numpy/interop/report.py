"""The cross-check report: one row a quantity, ours against the other framework's, printed as a table.

Each row is judged by its max abs error relative to the largest entry of the other side (``rtol``, by
default 1e-10 in float64 and 1e-5 in float32). A quantity that is 0 on both sides (e.g. dL/db_k, exactly
0 in theory) is judged on its abs error instead, against 1000 ulp of the dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DEFAULT_RTOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}


def rtol_for(dtype, rtol: float | None) -> float:
    """The pass threshold: ``rtol`` or the default of the dtype; refuses dtypes other than float32/64."""
    dtype = np.dtype(dtype)
    if dtype not in DEFAULT_RTOL:
        raise ValueError(f"cross-checks run in float32 or float64, got {dtype}")
    return DEFAULT_RTOL[dtype] if rtol is None else float(rtol)


@dataclass
class CrosscheckRow:
    """One named quantity, ours against the other framework's."""

    name: str
    theirs: str  # where the other side's number comes from
    shape: tuple
    max_abs_err: float
    max_rel_err: float  # max |ours - theirs| / max |theirs|: relative to the tensor's scale
    passed: bool
    zero: bool = False  # both sides are 0 to within zero_atol (e.g. dL/db_k): judged on the abs error
    note: str = ""


@dataclass
class CrosscheckReport:
    """A table of CrosscheckRow. ``passed`` is True when every row passes."""

    title: str
    dtype: np.dtype
    rtol: float
    rows: list[CrosscheckRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dtype = np.dtype(self.dtype)
        rtol_for(self.dtype, self.rtol)  # float32 / float64 only: zero_atol is 1000 ulp of the dtype

    @property
    def zero_atol(self) -> float:
        """Below this both sides count as an exact 0 (1000 ulp at 1)."""
        return 1000 * float(np.finfo(self.dtype).eps)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    def __getitem__(self, name: str) -> CrosscheckRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"{name!r}; rows are {[r.name for r in self.rows]}")

    def compare(self, name: str, theirs_label: str, ours, theirs, note: str = "") -> CrosscheckRow:
        a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"{name}: ours has shape {a.shape}, {theirs_label} has shape {b.shape}")
        bad_a, bad_b = int((~np.isfinite(a)).sum()), int((~np.isfinite(b)).sum())
        if bad_a or bad_b:
            row = CrosscheckRow(name, theirs_label, a.shape, np.nan, np.nan, False, note=note)
            row.note = f"non-finite entries: ours {bad_a}, theirs {bad_b}" + (f"; {note}" if note else "")
        else:
            err = float(np.abs(a - b).max()) if a.size else 0.0
            scale = float(np.abs(b).max()) if b.size else 0.0
            zero = max(scale, float(np.abs(a).max()) if a.size else 0.0) <= self.zero_atol
            rel = 0.0 if zero else (err / scale if scale > 0 else np.inf)
            passed = err <= self.zero_atol if zero else rel <= self.rtol
            row = CrosscheckRow(name, theirs_label, a.shape, err, rel, passed, zero, note)
        self.rows.append(row)
        return row

    def __str__(self) -> str:
        w = max([22, *(len(r.name) for r in self.rows)])  # long names (a BERT checkpoint's) keep the columns
        head = f"{'quantity':<{w}} {'theirs':<34} {'shape':<15} {'max abs err':>11} {'max rel err':>11}  ok"
        lines = [f"{self.title}  [{self.dtype.name}, pass: max rel err <= {self.rtol:g}]", head, "-" * len(head)]
        for r in self.rows:
            rel = "  zero grad" if r.zero else f"{r.max_rel_err:11.2e}"
            lines.append(
                f"{r.name:<{w}} {r.theirs:<34} {str(r.shape):<15} {r.max_abs_err:11.2e} {rel:>11}  "
                f"{'PASS' if r.passed else 'FAIL'}" + (f"  ({r.note})" if r.note else "")
            )
        lines += self.notes
        if any(r.zero for r in self.rows):
            lines.append(f"zero grad: exactly 0 in theory, both sides <= {self.zero_atol:.1e}; judged on the abs error")
        lines.append(f"RESULT: {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(lines)
