"""Every relative link and #anchor in README.md and docs/*.md resolves, with GitHub's anchor rules;
and the docs index (docs/README.md) lists every page under docs/."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and ![alt](target); the target stops at whitespace or ")". Reference-style links
# are not used in these pages.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines of a markdown page outside fenced code blocks (links and headings in code are text)."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lower-cased, every character that is
    not a letter, digit, space, hyphen or underscore dropped, each space made a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags render as nothing
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a page; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [m.group(1) for line in prose_lines(page.read_text(encoding="utf-8")) for m in LINK.finditer(line)]


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(page: Path) -> list[str]:
    """The relative links of `page` whose file or #anchor does not exist, each with the reason."""
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ... are not checked here
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {shown(dest)}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {shown(dest)}")
    return broken


def test_github_slug_matches_githubs_rules():
    assert github_slug("Throughput at the library default beta = 0.05") == "throughput-at-the-library-default-beta--005"
    assert github_slug("Where TRL's memory goes") == "where-trls-memory-goes"
    assert github_slug("Memory at a real vocabulary (`benchmarks/memory.py`)") == "memory-at-a-real-vocabulary-benchmarksmemorypy"
    assert github_slug("The attention mask at 8,192 tokens") == "the-attention-mask-at-8192-tokens"
    assert github_slug("Use it from Python (TRL's shape)") == "use-it-from-python-trls-shape"
    assert github_slug("`None`: \"does not apply\"") == "none-does-not-apply"
    assert github_slug("snake_case_name") == "snake_case_name"


def test_repeated_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n", encoding="utf-8")
    assert anchors(page) == {"a", "notes", "notes-1"}


def test_a_broken_link_and_a_broken_anchor_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n[ok](other.md#other-page) [ok](#title) [web](https://example.com/x)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [bad here](#nope)\n"
        "```\n[in code](not-checked.md)\n```\n",
        encoding="utf-8",
    )
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "other.md#nope", "#nope"]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_docs_index_lists_every_page():
    index = ROOT / "docs" / "README.md"
    listed = {(index.parent / target.partition("#")[0]).resolve() for target in links(index)}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    missing = sorted(p.name for p in pages - listed)
    assert missing == [], f"add a line for each of these pages to docs/README.md: {missing}"


# Pages whose code paths are checked too: a backticked path under one of ROOTS_CHECKED, or a dotted
# rloo.module[.name], must exist in the tree.
PATH_CHECKED_PAGES = [ROOT / "README.md", ROOT / "docs" / "README.md", ROOT / "docs" / "benchmarks.md"]
ROOTS_CHECKED = ("src/", "tests/", "benchmarks/", "examples/", "docs/", "recipes/", "rloo/")
CODE_SPAN = re.compile(r"`([^`\s]+)`")


def stale_code_paths(page: Path) -> list[str]:
    """Backticked file paths and `rloo.x.y` names in `page` that name nothing in the tree."""
    stale = []
    for line in prose_lines(page.read_text(encoding="utf-8")):
        for span in CODE_SPAN.findall(line):
            span = span.split("::")[0].rstrip(".,:;")  # a test's node id names its file
            if span.startswith(ROOTS_CHECKED) and not set("*{") & set(span):
                path = ROOT / "src" / span if span.startswith("rloo/") else ROOT / span
                if not path.exists():
                    stale.append(span)
            elif re.fullmatch(r"rloo(\.\w+)+", span) and not dotted_name_exists(span):
                stale.append(span)
    return stale


def dotted_name_exists(name: str) -> bool:
    """rloo.a.b[.attr]: the packages and module exist, and a trailing attribute appears in its source."""
    path, parts = ROOT / "src" / "rloo", name.split(".")[1:]
    for index, part in enumerate(parts):
        if (path / part).is_dir():
            path = path / part
            continue
        if (path / f"{part}.py").exists():
            path = path / f"{part}.py"
            rest = parts[index + 1:]
        else:
            rest = parts[index:]
            path = path / "__init__.py"
        return len(rest) <= 1 and all(re.search(rf"\b{attr}\b", path.read_text(encoding="utf-8")) for attr in rest)
    return True


def test_a_stale_code_path_is_found():
    text = "`src/rloo/no_such.py` `rloo.algo.loss` `rloo.algo.no_such` `rloo.toy.build_char_tokenizer` `tests/e2e/`"
    page = ROOT / "tests" / "e2e" / "_stale_path_probe.md"
    try:
        page.write_text(text, encoding="utf-8")
        assert stale_code_paths(page) == ["src/rloo/no_such.py", "rloo.algo.no_such"]
    finally:
        page.unlink()


@pytest.mark.parametrize("page", PATH_CHECKED_PAGES, ids=[str(p.relative_to(ROOT)) for p in PATH_CHECKED_PAGES])
def test_code_paths_in_these_pages_exist(page):
    assert stale_code_paths(page) == []
