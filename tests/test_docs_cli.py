"""Every ``sessionstore`` command in the README's and the quickstart's ``sh`` blocks runs as
pasted (issue 23): each block's commands run in order, in a scratch directory, through the CLI's
``main``, and must succeed. Only the sample's default size is made smaller, to keep the suite
fast; the commands themselves are not changed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from sessionstore import cli

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```sh\n(.*?)```", re.S)
DOCS = [ROOT / "README.md", ROOT / "docs" / "quickstart.md"]


def commands(block: str) -> list[list[str]]:
    """The ``sessionstore`` command lines of a block, continuations joined, comments dropped."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "sessionstore":
            found.append(words[1:])
    return found


def doc_commands(doc: Path) -> list[list[str]]:
    """Every command of ``doc``'s ``sh`` blocks, in order (a reader pastes them one by one)."""
    return [argv for match in BLOCK.finditer(doc.read_text()) for argv in commands(match.group(1))]


def test_each_doc_starts_its_commands_with_the_sample_they_read():
    for doc in DOCS:
        argvs = doc_commands(doc)
        assert argvs and argvs[0][:1] == ["sample"], doc.name
        assert sum(argv[0] == "sessionize" for argv in argvs) >= 2, doc.name


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_doc_commands_run_as_pasted(doc, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "SAMPLE_EVENTS", 30_000)
    # twice in one directory, as tests/test_docs.py runs the Python examples: a second paste
    # must not trip over what the first left (the --state run resumes, finished, and adds none)
    for argv in doc_commands(doc) * 2:
        status = cli.main(argv)
        captured = capsys.readouterr()
        assert status == 0, (argv, captured.err)
        if argv[0] == "sessionize":
            out = Path(argv[argv.index("--out") + 1])
            assert out.exists() and out.stat().st_size > 0, argv
            # without --state nothing is late; with it, the sample's few late events are
            # reported, under the 1% that fails a run
            assert "as late" not in captured.err or "--state" in argv, captured.err
