"""The book (docs/) and every Markdown file of the repository: no broken link, nothing cited
outside the repository, every page of the book in its table of contents, and a README that stays
a front page. CI also builds the book with mdBook (.ci/run); this test needs only Python."""

import functools
import os
import re
import shutil
import subprocess

import pytest
from test_tvm_ffi import ROOT

BOOK = os.path.join(ROOT, "docs", "src")
README_MAX_LINES = 250
# A Markdown link or image: [text](target) or ![alt](target), the target up to a space or ')'.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""(?:href|src)=["']([^"']+)["']""")
FENCE = re.compile(r"^\s*(```|~~~)")
# How a path outside the repository was cited before the book existed.
OUTSIDE = re.compile(r"\.\./shared/|shared/(DESIGN|spec|research)")


def tracked_files():
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [p for p in listed.stdout.decode().split("\0") if p]


def markdown_lines(path):
    """The lines of a Markdown file outside code blocks (links in code are examples, not links),
    with inline code spans blanked."""
    inside = False
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, re.sub(r"`[^`]*`", "``", line)


def slug(heading):
    """A heading's anchor as GitHub and mdBook both make it (ASCII headings)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def anchors(path):
    found = set()
    for _, line in markdown_lines(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            found.add(slug(m.group(1)))
        found.update(re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", line))
    return found


def broken_links(relative):
    path = os.path.join(ROOT, relative)
    problems = []
    for number, line in markdown_lines(path):
        for target in LINK.findall(line) + HTML_LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{relative}:{number}: {target}"
            if not (resolved == ROOT or resolved.startswith(ROOT + os.sep)):
                problems.append(f"{where} leaves the repository")
            elif not os.path.exists(resolved):
                problems.append(f"{where} names a file that does not exist")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                problems.append(f"{where} names no heading of {os.path.relpath(resolved, ROOT)}")
    return problems


def test_no_markdown_link_is_broken():
    pages = [p for p in tracked_files() if p.endswith(".md")]
    assert os.path.join("docs", "src", "SUMMARY.md") in pages
    problems = [problem for page in pages for problem in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_nothing_cites_a_path_outside_the_repository():
    hits = []
    for relative in tracked_files():
        path = os.path.join(ROOT, relative)
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue  # binary files and fixtures
        hits += [f"{relative}:{text.count(chr(10), 0, m.start()) + 1}" for m in OUTSIDE.finditer(text)]
    assert not hits, "cites a path outside the repository: " + ", ".join(hits)


def test_every_page_of_the_book_is_in_its_contents():
    summary = open(os.path.join(BOOK, "SUMMARY.md"), encoding="utf-8").read()
    listed = {os.path.normpath(t) for t in LINK.findall(summary)}
    pages = {
        os.path.relpath(os.path.join(d, f), BOOK)
        for d, _, files in os.walk(BOOK)
        for f in files
        if f.endswith(".md") and f != "SUMMARY.md"
    }
    assert pages - listed == set(), "pages missing from SUMMARY.md"


def test_the_readme_is_a_front_page():
    lines = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    # Every number the README quotes from a benchmark sits on a line that links its page.
    for number, line in enumerate(lines, 1):
        if re.search(r"\d\.\d+x\b", line) and "benchmarks/" not in line:
            pytest.fail(f"README.md:{number} quotes a ratio without linking its benchmark page: {line}")


def test_each_benchmark_page_shows_its_plot_and_run():
    pages = [f for f in os.listdir(os.path.join(BOOK, "benchmarks")) if f.endswith(".md")]
    runs = [f for f in pages if f not in ("index.md",) and not f.startswith("log")]
    assert runs, "no benchmark pages"
    for page in runs:
        text = open(os.path.join(BOOK, "benchmarks", page), encoding="utf-8").read()
        images = [t for t in LINK.findall(text) if t.endswith(".svg") or t.endswith(".png")]
        assert images, f"{page} has no plot"
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{page} names no date for its run"
        assert "Machine:" in text, f"{page} names no machine"


def test_the_book_builds(tmp_path):
    mdbook = shutil.which("mdbook") or os.path.expanduser("~/.cargo/bin/mdbook")
    if not os.access(mdbook, os.X_OK):
        pytest.skip("mdbook is not installed (cargo install mdbook --locked; .ci/run installs it)")
    out = subprocess.run(
        [mdbook, "build", os.path.join(ROOT, "docs"), "--dest-dir", str(tmp_path / "book")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ERROR" not in out.stderr, out.stderr
    rendered = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path / "book") for d, _, fs in os.walk(tmp_path / "book") for f in fs
    )
    for page in ("introduction.html", "guide/install.html", "architecture/overview.html", "benchmarks/index.html"):
        assert page in rendered
