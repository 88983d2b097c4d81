"""The markdown a newcomer reads: every relative link and #anchor in README.md, BENCHMARKS.md and docs/**/*.md
resolves, and the front pages stay short.

A link resolves when its file (or folder) exists inside the repository and, for `FILE.md#anchor` or `#anchor`,
the anchor is a heading of that file under GitHub's rules (`slug`: lowercase, spaces to '-', punctuation
dropped except '-' and '_', a repeated heading gets -1, -2, ...). Links inside code (fenced blocks, `spans`) and
links with a scheme (https:, mailto:) are not checked. No subprocess: the files are read and parsed here.
"""

from __future__ import annotations

import glob
import os
import re
import urllib.parse

from helpers import ROOT

LIMITS = {"README.md": 350, "docs/architecture.md": 300, "BENCHMARKS.md": 600}  # lines (issue 55)

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # [text], one level of nested brackets allowed
                   r"\(\s*(<[^>]*>|[^()\s]+(?:\([^()\s]*\)[^()\s]*)*)(?:\s+[\"'(][^)]*)?\s*\)")  # (target "title")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
_HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files(root: str = ROOT) -> list[str]:
    """The checked files, relative to root."""
    files = ["README.md", "BENCHMARKS.md"] + sorted(
        os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    return [f for f in files if os.path.isfile(os.path.join(root, f))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of the lines outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
        elif fence is not None and m and m.group(1).startswith(fence):
            fence = None
        elif fence is None:
            out.append((number, line))
    return out


def _plain(heading: str) -> str:
    """A heading's text as GitHub renders it: links and images by their text, no code marks, tags or emphasis."""
    heading = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    heading = re.sub(r"<[^>]+>", "", heading)
    return heading.replace("`", "").replace("*", "")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (github-slugger): lowercase; letters, digits, '-', '_' and spaces kept,
    every other character dropped; each space becomes '-'."""
    kept = "".join(ch for ch in _plain(heading).strip().lower() if ch.isalnum() or ch in "-_ ")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor of a markdown text: its headings' slugs (a repeated one numbered -1, -2, ...) and
    explicit `<a name=...>` / `<a id=...>`."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    lines = prose_lines(text)
    previous: tuple[int, str] | None = None
    for number, line in lines:
        heading = None
        m = _ATX.match(line)
        if m:
            heading = m.group(2)
        elif (_SETEXT.match(line) and previous is not None and previous[0] == number - 1 and previous[1].strip()
              and not _ATX.match(previous[1]) and not previous[1].lstrip().startswith(("|", "-", "*", ">"))):
            heading = previous[1]
        if heading is not None:
            base = slug(heading)
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
        out.update(a.lower() for a in _HTML_ID.findall(line))
        previous = (number, line)
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code: inline `[text](target)`, images, references."""
    out = []
    for number, line in prose_lines(text):
        line = re.sub(r"(`+).*?\1", "", line)  # code spans
        out += [(number, target.strip("<>")) for target in _LINK.findall(line)]
        m = _REFERENCE.match(line)
        if m:
            out.append((number, m.group(1).strip("<>")))
    return out


def broken_links(path: str, root: str = ROOT) -> list[str]:
    """'FILE:LINE: target (why)' for every relative link of `path` (relative to root) that does not resolve."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        text = f.read()
    here = os.path.dirname(os.path.join(root, path))
    problems = []
    for number, target in links(text):
        if _SCHEME.match(target) or target.startswith("//"):
            continue
        file_part, _, fragment = target.partition("#")
        file_part = urllib.parse.unquote(file_part)
        where = os.path.normpath(os.path.join(here, file_part)) if file_part else os.path.join(root, path)
        if os.path.relpath(where, root).startswith(".."):
            problems.append(f"{path}:{number}: {target} (outside the repository)")
        elif not os.path.exists(where):
            problems.append(f"{path}:{number}: {target} (no such file)")
        elif fragment and where.endswith(".md"):
            with open(where, encoding="utf-8") as f:
                if urllib.parse.unquote(fragment).lower() not in anchors(f.read()):
                    problems.append(f"{path}:{number}: {target} (no heading '#{fragment}' in "
                                    f"{os.path.relpath(where, root)})")
    return problems


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    files = doc_files()
    assert {"README.md", "BENCHMARKS.md", "docs/architecture.md"} <= set(files)
    problems = [p for f in files for p in broken_links(f)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(
        "# A guide\n\n## Install: the `pip` way (fast)\n\nText\n---\n\n## Install: the `pip` way (fast)\n")
    (tmp_path / "README.md").write_text(
        "# Front\n\n"
        "[ok](docs/guide.md) [ok](docs/guide.md#install-the-pip-way-fast) [ok](docs/guide.md#text) "
        "[ok](docs/guide.md#install-the-pip-way-fast-1) [ok](#front) [ok](docs/) [web](https://example.com/x.md)\n"
        "[gone](docs/missing.md) [no anchor](docs/guide.md#uninstall) ![no image](img/x.png)\n"
        "`[in code](nowhere.md)`\n```\n[in a block](nowhere.md)\n```\n"
        "[far](../outside.md) [self](#nope)\n")
    problems = broken_links("README.md", str(tmp_path))
    assert [p.split(": ", 1)[1] for p in problems] == [
        "docs/missing.md (no such file)", "docs/guide.md#uninstall (no heading '#uninstall' in docs/guide.md)",
        "img/x.png (no such file)", "../outside.md (outside the repository)",
        "#nope (no heading '#nope' in README.md)"], problems
    assert [p.split(":")[1] for p in problems] == ["4", "4", "4", "9", "9"]


def test_github_slugs():
    assert slug("On a GPU: nmt against transformers, one command (issue 36): `scripts/bench_gpu.py`") == \
        "on-a-gpu-nmt-against-transformers-one-command-issue-36-scriptsbench_gpupy"
    assert slug("Lean inference on 2 CPU cores (issue 27): memory, int8, against CTranslate2") == \
        "lean-inference-on-2-cpu-cores-issue-27-memory-int8-against-ctranslate2"
    assert slug("Start from a [pretrained](x.md) model") == "start-from-a-pretrained-model"
    assert slug("Decode keys: `decode.sampling.method`") == "decode-keys-decodesamplingmethod"


def test_the_front_docs_stay_short():
    for path, limit in LIMITS.items():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            n = len(f.read().splitlines())
        assert n <= limit, f"{path} has {n} lines, over {limit}: move detail to a guide in docs/ or to docs/history/"
