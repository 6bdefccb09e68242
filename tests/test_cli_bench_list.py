"""`sera-opt bench --help` lists every benchmark with its one-line description, and the
documentation lists the same set: the lists between ``<!-- benchmarks: begin -->`` and
``<!-- benchmarks: end -->`` in README.md, docs/api.md and docs/cli.md are compared with the parser's choices, names and descriptions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sera_opt.cli import main
from sera_opt.cli.catalog import BENCHMARK_DESCRIPTIONS
from sera_opt.cli.parser import build_parser

REPO = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"<!-- benchmarks: begin -->\n(.*?)<!-- benchmarks: end -->", re.DOTALL)
_ROW = re.compile(r"^\| `([\w-]+)` \| (.*) \|$")


def parser_benchmarks() -> list[str]:
    """The names ``sera-opt bench`` accepts, from the parser itself."""
    bench = build_parser().parse_known_args(["bench", "solvers"])[0].bench_parser
    (name,) = [a for a in bench._actions if a.dest == "name"]
    return list(name.choices)


def documented(page: Path) -> dict[str, str]:
    blocks = _BLOCK.findall(page.read_text(encoding="utf-8"))
    assert len(blocks) == 1, f"{page.name}: expected one marked list of benchmarks"
    rows = [_ROW.match(line) for line in blocks[0].splitlines()[2:] if line.strip()]
    assert all(rows), f"{page.name}: a row of the benchmark list is not `| `name` | text |`"
    return {m.group(1): m.group(2) for m in rows}


def test_the_catalog_is_what_the_parser_accepts():
    assert parser_benchmarks() == list(BENCHMARK_DESCRIPTIONS)
    assert all(text and "\n" not in text for text in BENCHMARK_DESCRIPTIONS.values())


def test_bench_help_lists_every_benchmark_with_its_description(capsys):
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    for name, text in BENCHMARK_DESCRIPTIONS.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(text)}$", out, re.MULTILINE), name
    assert all(len(line) <= 100 for line in out.splitlines()), "a help line is too long"


def test_bench_without_a_name_is_one_line_naming_them(capsys):
    for argv in (["bench"], ["bench", "--quick"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "name a benchmark first" in err, err
        assert all(name in err for name in BENCHMARK_DESCRIPTIONS), err


@pytest.mark.parametrize("page", ["docs/api.md", "docs/cli.md"])
def test_the_docs_list_the_parsers_benchmarks(page):
    assert documented(REPO / page) == BENCHMARK_DESCRIPTIONS


def test_the_readme_lists_the_parsers_benchmarks():
    assert documented(REPO / "README.md") == BENCHMARK_DESCRIPTIONS
