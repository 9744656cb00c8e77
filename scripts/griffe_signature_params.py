"""A Griffe extension for the API page (mkdocs.yml, mkdocstrings' ``extensions``): a function whose docstring has no
numpy-style ``Parameters`` section gets one made from its signature, so that every function of the API page shows a
parameter table (name, type, description, default) in one style.

Our docstrings are prose with shapes ("query: (B, Lq, E)", "mask: None, or ..."): a parameter's description is the
text after ``name:`` (up to the next two spaces or the end of the line) when the docstring has one, else empty. The
docstrings themselves stay as they are; only the rendered page gains the table.
"""

from __future__ import annotations

import re

import griffe


def described(text: str, name: str) -> str:
    m = re.search(rf"(?m)(?:^|\s)(?:\w+ / )?{re.escape(name)}(?: / \w+)?: (.+?)(?:\s{{2,}}|$)", text)
    return m[1].strip() if m else ""


class SignatureParameters(griffe.Extension):
    def on_function_instance(self, *, func: griffe.Function, **kwargs) -> None:
        if func.docstring is None or re.search(r"(?m)^\s*Parameters\s*\n\s*-{3,}", func.docstring.value):
            return
        params = [p for p in func.parameters if p.name not in ("self", "cls")]
        if not params:
            return
        lines = ["", "", "Parameters", "----------"]
        for p in params:
            star = {griffe.ParameterKind.var_positional: "*", griffe.ParameterKind.var_keyword: "**"}.get(p.kind, "")
            lines.append(f"{star}{p.name}" + (f" : {p.annotation}" if p.annotation is not None else ""))
            lines.append(f"    {described(func.docstring.value, p.name)}".rstrip() or "    ")
        func.docstring.value = func.docstring.value.rstrip() + "\n".join(lines)
