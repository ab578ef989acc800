"""Every relative link of README.md, README_CN.md and docs/*.md leads to a file of the repository, and every
'#anchor' to a heading of its page (GitHub's slugs), so that a page moved or a heading renamed cannot leave a
dead link behind."""
import os
import re

from conftest import DOC_FENCE, DOC_PAGES, ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(page):
    """The page's text without its fenced code blocks."""
    return DOC_FENCE.sub("", open(page, encoding="utf-8").read())


def headings(text):
    """The anchors of a page's headings."""
    return {slug(match.group(1)) for match in re.finditer(r"^#+ (.*)$", text, re.M)}


def test_slug_follows_github():
    assert slug("Start-up and MindSpore's compile cache") == "start-up-and-mindspores-compile-cache"
    assert slug("PYNATIVE_MODE and the runtime branch") == "pynative_mode-and-the-runtime-branch"
    assert slug("The test suite, earlier runs") == "the-test-suite-earlier-runs"


def test_every_relative_link_and_anchor_resolves():
    texts = {os.path.normpath(page): prose(page) for page in DOC_PAGES}
    anchors = {page: headings(text) for page, text in texts.items()}  # each page read once
    dead = []
    for page, text in texts.items():
        for match in LINK.finditer(text):
            link = match.group(1)
            if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
                continue
            target, _, fragment = link.partition("#")
            path = os.path.normpath(os.path.join(os.path.dirname(page), target)) if target else page
            if not os.path.exists(path):
                dead.append(f"{os.path.relpath(page, ROOT)}: {link} (no such file)")
            elif fragment and path.endswith(".md") and \
                    fragment not in (anchors[path] if path in anchors else headings(prose(path))):
                dead.append(f"{os.path.relpath(page, ROOT)}: {link} (no such heading)")
    assert not dead, "dead links:\n" + "\n".join(dead)
