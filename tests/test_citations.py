"""Every citation of the mathematics points at something the project ships.

Code, docs and tests justify a formula by citing a numbered section of docs/theory.md
("docs/theory.md section 9", "theory.md sections 2 and 4", "section 3 of theory.md",
a link to one of its headings). Each cited section must be a heading of that page, and
no file may cite a Markdown page the repository does not contain: a reader who follows
a citation must find the argument.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_doc_links import anchors

REPO = Path(__file__).resolve().parents[1]
THEORY = REPO / "docs" / "theory.md"

#: What a citation may be read from: the package, its adapters, the benchmarks, the
#: docs and the tests (this file included).
SOURCES = sorted(
    {
        REPO / "README.md",
        REPO / "CHANGELOG.md",
        *[p for d in ("sera_opt", "integrations", "benchmarks", "tests") for p in (REPO / d).rglob("*.py")],
        *[p for d in ("docs", "benchmarks") for p in (REPO / d).rglob("*.md")],
    }
)

# Between the page's name and "section" a citation may wrap onto a new comment line, be
# a Markdown link, or take a possessive: "theory.md](theory.md) section 2",
# "docs/theory.md\n    # section 9", "theory.md section 9's".
_GAP = r"(?:\]\([^)\s]*\))?(?:'s)?[\s#>*(]*"
# A list of section numbers: "9", "2 and 4", "3, 7 and 8", "5-6". A number is never
# followed by a decimal point and digit, so "section 9, 1.19 at p = 0.8" cites 9 only.
_NUMBER = r"\d+(?![\d]|\.\d)"
_NUMBERS = rf"{_NUMBER}(?:(?:\s*,\s*(?:and\s+)?|\s+and\s+|\s+or\s+|\s*-\s*|\s+to\s+){_NUMBER})*"
CITATION = re.compile(
    rf"theory\.md{_GAP}sections?[\s#>*]+(?P<after>{_NUMBERS})"
    rf"|sections?\s+(?P<before>{_NUMBERS})\s+of\s+\[?(?:\.\./)*(?:docs/)?theory\.md",
    re.IGNORECASE,
)
LINK = re.compile(r"theory\.md#(?P<anchor>[\w-]+)")
# A Markdown file name as written in prose, code or links ("docs/api.md", "[api](api.md)").
PAGE = re.compile(r"(?<![\w./-])((?:\.\./|\./)*[\w.-]+(?:/[\w.-]+)*\.md)\b")
# Within docs/theory.md itself an argument refers to its other sections plainly.
INTERNAL = re.compile(rf"\bsections?\s+(?P<numbers>{_NUMBERS})", re.IGNORECASE)


def theory_sections(text: str) -> set[int]:
    """The numbers of the page's numbered headings ("## 9. Allocation in rounds ...")."""
    return {int(m.group(1)) for m in re.finditer(r"^##\s+(\d+)\.\s", text, re.MULTILINE)}


def cited_sections(text: str) -> list[tuple[int, int]]:
    """Each section number the text cites, with the line it is cited on."""
    found = []
    for match in CITATION.finditer(text):
        numbers = match.group("after") or match.group("before")
        line = text.count("\n", 0, match.start()) + 1
        for lo, dash, hi in re.findall(r"(\d+)(?:\s*(-|to)\s*(\d+))?", numbers):
            span = range(int(lo), int(hi) + 1) if dash else [int(lo)]
            found.extend((number, line) for number in span)
    return found


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_the_parser_reads_every_form_of_citation():
    page = "theory" + ".md"  # spelled apart so this test's examples are not themselves read
    text = "\n".join(
        [
            f"see docs/{page} section 9,",
            f"(docs/{page} sections 2 and 4)",
            f"from {page} sections 3, 7 and 8, independent",
            f"[{page}]({page}) section 2 and",
            f"# the rounds (docs/{page}\n    # section 6; by default 4)",
            f"{page} section 5's simulation: 1.19 at p = 0.8",
            f"sections 1-3 of docs/{page}",
            f"section 7 of [{page}]({page})",
        ]
    )
    assert sorted(n for n, _ in cited_sections(text)) == [1, 2, 2, 2, 3, 3, 4, 5, 6, 7, 7, 8, 9]
    assert cited_sections(f"docs/{page} section 9, 1.19 at p = 0.8") == [(9, 1)]
    assert cited_sections(f"docs/{page} describes it") == []


def test_theory_numbers_its_sections_in_order():
    numbers = sorted(theory_sections(THEORY.read_text()))
    assert numbers == list(range(1, len(numbers) + 1)), numbers


@pytest.mark.parametrize("source", SOURCES, ids=relative)
def test_every_cited_section_exists(source):
    sections = theory_sections(THEORY.read_text())
    text = source.read_text(errors="replace")
    missing = [f"line {line}: section {n}" for n, line in cited_sections(text) if n not in sections]
    assert not missing, f"{relative(source)} cites sections docs/theory.md does not have: {missing}"


@pytest.mark.parametrize("source", SOURCES, ids=relative)
def test_every_link_to_a_theory_heading_resolves(source):
    headings = anchors(THEORY)
    text = source.read_text(errors="replace")
    broken = [m.group("anchor") for m in LINK.finditer(text) if m.group("anchor") not in headings]
    assert not broken, f"{relative(source)} links to headings docs/theory.md does not have: {broken}"


def test_theory_refers_only_to_its_own_sections():
    text = THEORY.read_text()
    sections = theory_sections(text)
    cited = {int(n) for m in INTERNAL.finditer(text) for n in re.findall(r"\d+", m.group("numbers"))}
    assert cited <= sections, sorted(cited - sections)


def unshipped_pages(text: str, folder: Path) -> list[str]:
    """The Markdown pages ``text`` (a file in ``folder``) names that the repository lacks.

    A name resolves, inside the repository, from the citing file's folder,
    from the repository root or from docs/ (code calls docs/api.md "api.md" too); anything
    else, a private or external spec, is a dead end for the reader.
    """
    unknown = []
    for name in sorted(set(PAGE.findall(text))):
        candidates = [(base / name).resolve() for base in (folder, REPO, REPO / "docs")]
        if not any(c.is_file() and c.is_relative_to(REPO) for c in candidates):
            unknown.append(name)
    return unknown


def test_a_page_outside_the_project_is_caught():
    spec, page = "THEORY" + ".md", "theory" + ".md"
    text = f"(see {spec} section 9; docs/{page} section 9, ../shared/{spec}, [api](api.md))"
    assert unshipped_pages(text, REPO / "sera_opt") == [f"../shared/{spec}", spec]
    assert unshipped_pages(text.replace(spec, page), REPO / "docs") == [f"../shared/{page}"]


@pytest.mark.parametrize("source", SOURCES, ids=relative)
def test_no_citation_of_a_page_the_project_does_not_ship(source):
    unknown = unshipped_pages(source.read_text(errors="replace"), source.parent)
    assert not unknown, f"{relative(source)} cites pages the project does not ship: {unknown}"


def test_the_tests_docs_theory_names_exist():
    """docs/theory.md names, in brackets, the test that checks each claim: every such name
    is a test function of the suite, so a renamed test cannot leave a claim unchecked."""
    defined = {m.group(1) for path in (REPO / "tests").rglob("test_*.py")
               for m in re.finditer(r"^\s*def (test_\w+)\(", path.read_text(), re.MULTILINE)}
    named = {name for bracket in re.findall(r"\[([^\]]*)\](?!\()", THEORY.read_text())
             for name in re.findall(r"(?<![\w/])test_\w+\b(?!\.)", bracket)}  # not tests/x.py
    assert named, "docs/theory.md names no tests; the bracket convention changed?"
    assert not named - defined, sorted(named - defined)
