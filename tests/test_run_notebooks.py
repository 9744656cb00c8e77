"""scripts/run_notebooks.py tells a real change from noise: numbers that differ by rounding and PNGs whose bytes
(not pixels) differ are the same output, so a re-run keeps the committed outputs and ``--check`` passes; a changed
number, a changed figure or a changed cell is a change. (The notebooks themselves run in tests/test_notebooks.py.)"""

from __future__ import annotations

import base64
import copy
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed: pip install -r requirements-dev.txt")
pytest.importorskip("nbclient", reason="nbclient is not installed: pip install -r requirements-dev.txt")
import run_notebooks as rn  # noqa: E402


def png(pixels, software: str) -> str:
    """A PNG of ``pixels`` (H, W, 3) in 0..1, with a Software text chunk (what differs between machines)."""
    from matplotlib import image

    buf = io.BytesIO()
    image.imsave(buf, pixels, format="png", metadata={"Software": software})
    return base64.b64encode(buf.getvalue()).decode()


def notebook(text: str, picture: str):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(err); fig")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=text),
        nbformat.v4.new_output("display_data", data={"image/png": picture, "text/plain": "<Figure size 640x480>"}),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), cell]
    return nb


def test_noise_is_not_a_change_and_a_real_change_is():
    import numpy as np

    pixels = np.random.default_rng(0).random((8, 12, 3))
    committed = notebook("max rel err 2.3e-16, loss 0.693147180559945\n", png(pixels, "Matplotlib 3.10"))
    rerun = notebook("max rel err 1.1e-16, loss 0.693147180559946\n", png(pixels, "Matplotlib 3.11"))
    assert rerun.cells[1].outputs[1].data["image/png"] != committed.cells[1].outputs[1].data["image/png"]
    assert rn.keep_committed(rerun, committed) == []
    assert rerun.cells[1].outputs == committed.cells[1].outputs  # the committed bytes are kept
    split = copy.deepcopy(committed)  # the kernel split the stream in two and flushed an empty chunk at the end
    text = split.cells[1].outputs[0].text
    split.cells[1].outputs[0].text = text[:10]
    split.cells[1].outputs.insert(1, nbformat.v4.new_output("stream", name="stdout", text=text[10:]))
    split.cells[1].outputs.append(nbformat.v4.new_output("stream", name="stdout", text="\n"))
    assert rn.keep_committed(split, committed) == []

    for text, picture in [
        ("max rel err 2.3e-16, loss 0.693\n", png(pixels, "Matplotlib 3.10")),  # a number really changed
        ("max rel err 2.3e-16, loss 0.693147180559945 !\n", png(pixels, "Matplotlib 3.10")),  # the text changed
        ("max rel err 2.3e-16, loss 0.693147180559945\n", png(1 - pixels, "Matplotlib 3.10")),  # another figure
        ("max rel err 2.3e-16, loss 0.693147180559945\n", png(pixels[:, :6], "Matplotlib 3.10")),  # another size
    ]:
        assert rn.keep_committed(notebook(text, picture), copy.deepcopy(committed)) == [1], text
    edited = copy.deepcopy(committed)
    edited.cells[1].source = "print(err)"
    assert rn.keep_committed(edited, committed) == [1]


def test_check_mode_writes_nothing_and_exits_1_on_a_real_change(tmp_path, monkeypatch):
    path = tmp_path / "nb.ipynb"
    committed = notebook("loss 0.5\n", png([[[0.0, 0.5, 1.0]]], "x"))
    nbformat.write(committed, path)
    before = path.read_bytes()

    def execute(nb, cwd, timeout):  # a re-run that prints another loss
        nb.cells[1].outputs[0].text = "loss 0.25\n"
        return nb

    monkeypatch.setattr(rn, "execute_notebook", execute)
    assert rn.main(["--check", str(path)]) == 1 and path.read_bytes() == before
    monkeypatch.setattr(rn, "execute_notebook", lambda nb, cwd, timeout: nb)  # the same outputs
    assert rn.main(["--check", str(path)]) == 0 and rn.main([str(path)]) == 0 and path.read_bytes() == before


def test_a_silent_cell_never_run_before_takes_its_new_count():
    """A new notebook's cell with no output (imports) was kept unexecuted, so the saved file failed
    test_notebooks' "counts 1, 2, 3" check until it was run by another means."""
    committed = nbformat.v4.new_notebook()
    committed.cells = [nbformat.v4.new_code_cell("import math"), nbformat.v4.new_code_cell("print(1)")]
    rerun = copy.deepcopy(committed)
    rerun.cells[0].execution_count, rerun.cells[1].execution_count = 1, 2
    rerun.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    assert rn.keep_committed(rerun, committed) == [0, 1]
    assert [c.execution_count for c in rerun.cells] == [1, 2]
    again = copy.deepcopy(rerun)  # run once more: nothing changed, the saved counts stay
    assert rn.keep_committed(again, rerun) == [] and [c.execution_count for c in again.cells] == [1, 2]


def figure(title: str, ticks=(128, 512, 1024), scale: float = 1.0, software: str = "x") -> str:
    """A small line plot as a notebook saves it (base64 PNG at dpi 80), titled ``title``, its x ticks at ``ticks``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2), dpi=80)
    ax = fig.subplots()
    ax.plot([128, 256, 512, 1024], [0.0037 * scale, 0.0075 * scale, 0.0879 * scale, 0.2071 * scale], marker="o")
    ax.set(title=title, xticks=ticks)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": software})
    return base64.b64encode(buf.getvalue()).decode()


def test_a_figure_changed_in_its_text_is_a_change_and_a_cell_is_replaced_whole():
    """Notebook 05 was saved with its figure titled "load 8.6" (kept, an old run) under a table of the new run saying
    "load 10.0": the PNGs were compared by their mean pixel difference, ~0.001 for a changed title or tick label."""
    old = figure("load 8.6")
    assert rn.same_png(old, figure("load 8.6", scale=1 + 1e-12, software="y"))  # rounding, other bytes: noise
    assert not rn.same_png(old, figure("load 10.0"))
    assert not rn.same_png(old, figure("load 8.6", ticks=(128, 256, 1024)))

    def two_cells(load: str, title: str, software: str):
        nb = nbformat.v4.new_notebook()
        table, plot = nbformat.v4.new_code_cell("print(table)"), nbformat.v4.new_code_cell("print(err); fig")
        table.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"load {load}\n")]
        plot.outputs = [
            nbformat.v4.new_output("stream", name="stdout", text="max err 2.2e-06\n"),
            nbformat.v4.new_output("display_data", data={"image/png": figure(title, software=software)}),
        ]
        nb.cells = [table, plot]
        return nb

    committed = two_cells("8.6", "load 8.6", "x")
    rerun = two_cells("10.0", "load 10.0", "y")
    assert rn.keep_committed(rerun, copy.deepcopy(committed)) == [0, 1]
    assert rerun.cells[1].outputs[1].data["image/png"] == figure("load 10.0", software="y")  # the new figure
    # a cell whose figure is the same but for its bytes and whose text changed takes all its new outputs, figure too
    rerun = two_cells("8.6", "load 8.6", "y")
    rerun.cells[1].outputs[0].text = "max err 3.1e-06\n"
    assert rn.keep_committed(rerun, copy.deepcopy(committed)) == [1]
    assert rerun.cells[1].outputs[1].data["image/png"] == figure("load 8.6", software="y")


def test_a_number_printed_in_another_format_is_a_change():
    """A report's format went from .2e to .1e: both numbers are below NOISE_FLOOR, and the old text was kept."""
    assert not rn.same_text("max err 1.67e-16\n", "max err 1.7e-16\n")
    assert not rn.same_text("loss 0.50\n", "loss 0.5\n") and not rn.same_text("lr 1e-05", "lr 1.0e-05")
    assert rn.same_text("max err 2.3e-16\n", "max err 1.1e-16\n")  # one format, rounding-level: noise
    # a float printed in full changes its length and notation with its value: two such are one format
    assert rn.same_text("err 1.6653345369377348e-16", "err 2.220446049250313e-16")
    assert rn.same_text("err 0.0", "err 1.1102230246251565e-16")
    assert not rn.same_text("err 0.0", "err 1.1e-16")
