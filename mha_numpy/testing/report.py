"""The report of ``verify_attention``: one row a case (its worst tensor's error, budget and their ratio, PASS / FAIL,
the detected convention), as a text table, a dict for JSON, or an HTML page."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

from .cases import Case
from .conventions import BY_NAME
from .tolerance import Check, K

RULE = (
    f"a tensor passes when max|fn - ref| <= {K:g} · max|plain - ref| + {K:g} · (eps · (1 + max|s|) + sqrt(n) · eps64)"
    " · max|ref|: ref = mha_numpy's kernel in float64, plain = the same path in the case's dtype, s the scores "
    "(docs/verify.md)"
)
STATUSES = ("PASS", "FAIL", "ERROR", "n/a")  # ERROR: the function raised, exited or hung; n/a: it does not take it


@dataclass
class CaseResult:
    """What happened on one case."""

    case: Case
    status: str
    checks: dict = field(default_factory=dict)  # tensor name -> tolerance.Check
    detected: str | None = None  # an Alternative's name (conventions.ALTERNATIVES), or "A + B"
    message: str = ""  # why n/a, the exception, a wrong shape, what no convention explains
    written: tuple = ()  # the arguments the function wrote into (a failure of its own: inputs stay as given)

    @property
    def worst(self) -> Check | None:
        return max(self.checks.values(), key=lambda c: c.ratio, default=None)

    @property
    def failed(self) -> bool:
        return self.status in ("FAIL", "ERROR")

    def to_dict(self) -> dict:
        tensors = {n: {"error": _num(c.error), "budget": _num(c.budget), "ratio": _num(c.ratio),
                       "plain_error": _num(c.plain_error), "floor": _num(c.floor)}
                   for n, c in self.checks.items()}  # fmt: skip
        c = self.case
        return {"case": c.id, "name": c.name, "group": c.group, "dtype": c.dtype,
                "shape": dict(B=c.B, H=c.H, Hkv=c.Hkv, Lq=c.Lq, Lk=c.Lk, d=c.d), "mask": c.mask, "form": c.form,
                "is_causal": c.is_causal, "scale": c.scale, "dropout_p": c.dropout_p, "logits": c.logits,
                "status": self.status, "tensors": tensors, "detected": self.detected,
                "detected_text": describe(self.detected), "written": list(self.written),
                "message": self.message}  # fmt: skip


def _num(x: float):
    """A float for JSON: inf and NaN as strings (JSON has neither)."""
    return x if math.isfinite(x) else str(x)


def describe(detected: str | None) -> str:
    """What a detected convention (one name, or "A + B") means, in words."""
    if not detected:
        return ""
    return "; and ".join(BY_NAME[n].text for n in detected.split(" + ") if n in BY_NAME)


@dataclass
class VerifyReport:
    """The results of one implementation on a matrix. ``passed``: no case failed (n/a cases do not count)."""

    implementation: str
    cases: str
    results: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seconds: float = 0.0  # wall time
    cpu_seconds: float = 0.0  # this process's CPU time
    HEAD = ["#", "case", "dtype", "shape", "worst", "error", "budget", "x budget", "result", "detected"]  # the HTML's

    @property
    def rule(self) -> str:
        """The rule a tensor passes by (a report of another kind, ``flex_verify.FlexReport``, has its own)."""
        return RULE

    @property
    def passed(self) -> bool:
        return not any(r.failed for r in self.results)

    def counts(self) -> dict:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    def detected(self) -> dict:
        """Detected convention -> how many failing cases it explains."""
        found = {}
        for r in self.results:
            if r.detected:
                found[r.detected] = found.get(r.detected, 0) + 1
        return found

    def summary(self) -> str:
        n = self.counts()
        parts = [f"{n['PASS']} passed", f"{n['FAIL']} failed"] + [f"{n[s]} {s}" for s in ("ERROR", "n/a") if n[s]]
        return f"{', '.join(parts)} of {len(self.results)} cases"

    def rows(self) -> list[list[str]]:
        """The table's cells, one list a case."""
        out = []
        for i, r in enumerate(self.results, 1):
            w = r.worst
            cells = [str(i), r.case.name, r.case.dtype, r.case.shape]
            if w is None:
                cells += ["", "", "", ""]
            else:
                cells += [w.name, f"{w.error:.1e}", f"{w.budget:.1e}", _ratio(w.ratio)]
            cells += [r.status, r.detected or (r.message if r.status != "PASS" else "")]
            out.append(cells)
        return out

    def __str__(self) -> str:
        head = ["#", "case", "dtype", "shape", "worst", "error", "budget", "x budget", "result", "detected"]
        rows = self.rows()
        widths = [max(len(head[j]), *(len(r[j]) for r in rows)) if rows else len(head[j]) for j in range(len(head))]
        widths[-1] = len(head[-1])  # the last column is free text

        def line(cells):
            return "  ".join(c.ljust(w) if j not in (0, 5, 6, 7) else c.rjust(w) for j, (c, w) in
                             enumerate(zip(cells, widths))).rstrip()  # fmt: skip

        lines = [f"mha_numpy verify: {self.implementation}, {len(self.results)} cases ({self.cases})", f"rule: {RULE}"]
        lines += [f"note: {n}" for n in self.notes]
        lines += ["", line(head), line(["-" * w for w in widths])] + [line(r) for r in rows] + [""]
        lines.append(f"RESULT: {'PASS' if self.passed else 'FAIL'}: {self.summary()}"
                     f" ({self.seconds:.1f} s, CPU {self.cpu_seconds:.1f} s)")  # fmt: skip
        for name, n in sorted(self.detected().items(), key=lambda kv: -kv[1]):
            lines.append(f"detected in {n} case{'s' * (n != 1)}: {name}: {describe(name)}")
        mutated = [r for r in self.results if r.written]
        if mutated:
            names = ", ".join(dict.fromkeys(n for r in mutated for n in r.written))
            lines.append(f"{len(mutated)} case{'s' * (len(mutated) != 1)} wrote into the function's inputs ({names}): "
                         "a function must leave its arguments as given (judged on copies)")  # fmt: skip
        errors = sum(r.status == "ERROR" for r in self.results)
        if errors:
            lines.append(f"{errors} case{'s' * (errors != 1)} gave nothing to judge: the function raised, exited or "
                         "did not return in time (the row says which)")  # fmt: skip
        unexplained = sum(r.status == "FAIL" and not r.detected and not r.written for r in self.results)
        if unexplained:
            lines.append(f"{unexplained} failing case{'s' * (unexplained != 1)} match no known convention: a bug "
                         "(the row's message says which tensor is wrong)")  # fmt: skip
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"implementation": self.implementation, "cases": self.cases, "rule": RULE, "k": K,
                "passed": self.passed, "counts": self.counts(), "detected": self.detected(), "notes": self.notes,
                "seconds": self.seconds, "cpu_seconds": self.cpu_seconds,
                "results": [r.to_dict() for r in self.results]}  # fmt: skip

    def to_html(self) -> str:
        """One self-contained page (no script, no network): the table, failing rows marked."""
        esc = html.escape
        head = self.HEAD
        body = []
        for r, cells in zip(self.results, self.rows()):
            cls = {"PASS": "pass", "n/a": "na"}.get(r.status, "fail")
            body.append(f'<tr class="{cls}">' + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
        legend = "".join(
            f"<li><b>{esc(n)}</b>: {esc(describe(n))} ({k} cases)</li>" for n, k in self.detected().items()
        )
        return (
            "<!DOCTYPE html><html><head><meta charset='utf-8'><title>mha_numpy verify</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}tr.fail{background:#fdd}"
            "tr.na{color:#888}</style></head><body>"
            f"<h1>mha_numpy verify: {esc(self.implementation)}</h1><p>{esc(self.summary())} ({esc(self.cases)} "
            f"matrix, {self.seconds:.1f} s)</p><p>Rule: {esc(self.rule)}</p><ul>{legend}</ul><table><tr>"
            + "".join(f"<th>{esc(h)}</th>" for h in head)
            + "</tr>"
            + "".join(body)
            + "</table></body></html>"
        )


def _ratio(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.2f}" if x < 1000 else f"{x:.1e}"
