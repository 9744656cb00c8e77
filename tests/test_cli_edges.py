"""The command line's last rough edges (issue 26, item 6): ``train --html`` alone writes only its page (no PNGs in
the current directory), and ``bert ""`` is a usage error instead of a silent [CLS] [SEP]. (``crosscheck --model
bert`` printing no loading bar is asserted where that command already runs: tests/test_bert_backward.py.)"""

from __future__ import annotations

import pytest

from mha_numpy.__main__ import main


def test_train_html_alone_writes_only_the_page(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: pip install -r requirements-dev.txt")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--steps", "1", "--html", "t.html"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.html"]
    assert "wrote" not in capsys.readouterr().out.replace("wrote t.html", "")


@pytest.mark.parametrize("text", ["", "   "])
def test_bert_on_an_empty_sentence_is_one_line_and_exit_2(text, capsys):
    assert main(["bert", text]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "empty" in err and "text" in err
