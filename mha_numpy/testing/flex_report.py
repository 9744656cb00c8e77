"""The report of ``verify_flex``: a ``VerifyReport`` whose rows name each case's first wrong tensor (out, lse, dq, dk,
dv or a parameter), and ``first_wrong``, the first of them all."""

from __future__ import annotations

from dataclasses import dataclass

from .report import VerifyReport

TOL = 1e-10  # of the largest magnitude: float64 against float64
RULE = (f"a tensor passes when max|yours - ref| <= tol · max|ref| (tol = {TOL:g} unless given; ref: torch's eager "
        "flex_attention in float64 for out and lse, mha_numpy.flex_attention_backward for the gradients)")  # fmt: skip


@dataclass
class FlexReport(VerifyReport):
    """``VerifyReport`` of a FlexAttention call: a row a case with its first wrong tensor; ``first_wrong``."""

    tol: float = TOL
    HEAD = ["#", "case", "shape", "first wrong", "error", "allowed", "result", "message"]

    @property
    def rule(self) -> str:
        """The rule a tensor passes by, with this report's tolerance."""
        return RULE.replace(f"tol = {TOL:g}", f"tol = {self.tol:g}")

    @property
    def first_wrong(self) -> tuple[str, float, str] | None:
        """(tensor, its max error, the case's id) of the first failing check of the first failing case: out, lse,
        dq, dk, dv or a parameter's name; None when every judged tensor passed."""
        for r in self.results:
            bad = [c for c in r.checks.values() if not c.passed]
            if bad:
                return bad[0].name, bad[0].error, r.case.id
        return None

    def rows(self) -> list[list[str]]:
        """The table's cells, one list a case: its first wrong tensor, that one's error and allowance."""
        out = []
        for i, r in enumerate(self.results, 1):
            bad = [c for c in r.checks.values() if not c.passed]
            cells = [str(i), r.case.name, r.case.shape]
            cells += [bad[0].name, f"{bad[0].error:.1e}", f"{bad[0].budget:.1e}"] if bad else ["", "", ""]
            out.append(cells + [r.status, r.message])
        return out

    def __str__(self) -> str:
        rows = self.rows()
        widths = [max(len(h), *(len(r[j]) for r in rows)) if rows else len(h) for j, h in enumerate(self.HEAD)]
        widths[-1] = len(self.HEAD[-1])  # the message: free text

        def line(cells):
            """One row of the table, its columns padded."""
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

        lines = [f"mha_numpy verify: {self.implementation}, {len(self.results)} cases", f"rule: {self.rule}"]
        lines += [f"note: {n}" for n in self.notes]
        lines += ["", line(self.HEAD), line(["-" * w for w in widths])] + [line(r) for r in rows] + [""]
        lines.append(f"RESULT: {'PASS' if self.passed else 'FAIL'}: {self.summary()} ({self.seconds:.1f} s)")
        first = self.first_wrong
        if first is not None:
            lines.append(f"first wrong: {first[0]} (max error {first[1]:.2e}) in case {first[2]}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """VerifyReport's dict for JSON, with this rule, the tolerance and ``first_wrong``."""
        first = self.first_wrong
        named = None if first is None else {"tensor": first[0], "error": first[1], "case": first[2]}
        return {**super().to_dict(), "rule": self.rule, "tol": self.tol, "first_wrong": named}
