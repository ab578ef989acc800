"""The documentation's examples run as written: every Python block of README.md and docs/*.md, and the command
that opens each docs page that starts with one."""
import os
import subprocess
import sys

import pytest

from conftest import DOC_FENCE, DOC_PAGES, ROOT
from helpers import run_python

pytestmark = pytest.mark.slow
SKIP = "<!-- not run by tests/test_docs.py"


def blocks(path):
    """(language, code, whether it opens the page, whether it is marked not to run) for each fenced block."""
    text = open(path, encoding="utf-8").read()
    out = []
    for index, match in enumerate(DOC_FENCE.finditer(text)):
        before = text[:match.start()].rstrip().splitlines()
        marked = bool(before) and before[-1].startswith(SKIP)
        out.append((match.group(1), match.group(2), index == 0, marked))
    return out


EXAMPLES = [(os.path.relpath(page, ROOT), n, language, code)
            for page in DOC_PAGES for n, (language, code, first, marked) in enumerate(blocks(page))
            if not marked and (language == "python" or (language == "bash" and first and "docs" in page))]


def test_every_docs_page_opens_with_an_example():
    for page in DOC_PAGES[2:]:
        found = blocks(page)
        assert found and found[0][0] in ("python", "bash"), f"{page} must start with a runnable example"


@pytest.mark.parametrize("page, index, language, code", EXAMPLES,
                         ids=[f"{page}#{index}" for page, index, _, _ in EXAMPLES])
def test_example_runs_as_written(page, index, language, code, tmp_path):
    path = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    if language == "python":  # as `python example.py` (helpers.run_python); not depending on the directory
        script = tmp_path / "example.py"
        script.write_text(code, encoding="utf-8")
        proc = run_python([script], env=path, cwd=tmp_path)
    else:  # commands run from the repository root
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=ROOT, **path), capture_output=True, text=True,
                              timeout=600, check=False)
    assert proc.returncode == 0, f"{page} block {index} failed:\n{code}\n--- stdout\n{proc.stdout[-3000:]}\n" \
                                 f"--- stderr\n{proc.stderr[-3000:]}"
