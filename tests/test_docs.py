"""The docs hold together: the README is short and links every page of docs/, and every relative link in the
README, docs/ and bench/README.md leads to a file that exists."""

from __future__ import annotations

import re

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]


def test_the_readme_is_short_and_links_every_page_of_the_manual() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 10_000  # the manual lives in docs/
    manual = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert "commands.md" in manual and [p for p in manual if f"](docs/{p})" not in readme] == []


def test_every_relative_link_leads_to_a_file() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"^[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
