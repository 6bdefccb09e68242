"""CHANGELOG.md is a record of releases that agrees with the code: one "Unreleased" section on
top, released versions with dates below it, the newest release the package's version, and
the default allocation it names the planner's."""

from __future__ import annotations

import re
from pathlib import Path

import sera_opt
from sera_opt.planner import DEFAULT_POLICY

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"
_RELEASE = re.compile(r"^## (\d+\.\d+\.\d+) \((\d{4}-\d{2}-\d{2})\)$")


def _sections() -> list[str]:
    return [line for line in CHANGELOG.read_text().splitlines() if line.startswith("## ")]


def test_one_unreleased_section_above_dated_releases():
    sections = _sections()
    assert sections[0] == "## Unreleased", sections[:2]
    assert sections.count("## Unreleased") == 1
    releases = sections[1:]
    assert releases and all(_RELEASE.match(line) for line in releases), releases


def test_the_newest_release_is_the_packages_version():
    newest = _RELEASE.match(_sections()[1])
    assert newest is not None and newest[1] == sera_opt.__version__


def test_a_release_says_what_its_users_get_not_what_was_fixed_before_it():
    text = CHANGELOG.read_text()
    first_release = text.split("\n## ", 2)[2]
    assert "### Fixed" not in first_release, "0.1.0 fixes nothing: nothing was released before it"
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text), "no commit hashes in the changelog"


def test_the_default_it_names_is_the_planners():
    text = CHANGELOG.read_text()
    named = re.findall(r"DEFAULT_POLICY =\s+\"([\w-]+)\"", text)
    assert named and set(named) == {DEFAULT_POLICY}, named
    assert "gives every prompt the same number of rollouts" in text and DEFAULT_POLICY == "uniform"
