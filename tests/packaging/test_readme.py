"""The README and the pages in docs/ stay true to the repository: every relative link (and its #anchor)
resolves, every `loopnet <command>`, `make <target>`, `python -m loopnet...` module and `configs/...yaml`
file they name exists, the README stays a front page, and the reference tables stay complete. Text only:
no fit runs here."""

import re
from pathlib import Path

import pytest

from loopnet.commands import TOOLS
from loopnet.training.subcommands import SUBCOMMANDS
from loopnet.study.grid import SWEEP_KEYS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The README and the topic pages; docs/results/ holds study reports with their own layout.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs/benchmarks").glob("*.md"))]


def ids(pages):
    return [str(p.relative_to(ROOT)) for p in pages]


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def section(page: Path, title: str) -> str:
    body = text(page)
    assert f"\n## {title}\n" in body, f"{page.name} has no section '## {title}'"
    return body.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def without_code(body: str) -> str:
    return re.sub(r"```.*?```", "", body, flags=re.S)


def code(body: str) -> list[str]:
    """The lines of every fenced block and every inline code span: where commands are written."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", body, flags=re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", body, flags=re.S))
    return [line for b in blocks for line in b.splitlines()] + spans


def commands(body: str, program: str) -> set[str]:
    """The first word after `program` wherever it starts a shell command (not in a comment or prose)."""
    found = set()
    for line in code(body):
        found |= set(re.findall(rf"(?:^|&&|;|\|)\s*(?:\S*/)?{program} ([a-z][\w-]*)", line))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", without_code(text(page)), flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_relative_link_resolves(page):
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", without_code(text(page))):
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {', '.join(broken)}"


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_loopnet_command_named_exists(page):
    known = set(SUBCOMMANDS) | set(TOOLS)
    named = commands(text(page), "loopnet")
    assert named <= known, f"{page.relative_to(ROOT)} names unknown commands {sorted(named - known)}"


def test_the_readme_names_every_tool():
    assert set(TOOLS) <= commands(text(README), "loopnet")


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(), flags=re.M))


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_make_target_named_exists(page):
    named = commands(text(page), "make")
    assert named <= makefile_targets(), (
        f"{page.relative_to(ROOT)} names unknown targets {sorted(named - makefile_targets())}"
    )


def test_the_readme_gives_the_quick_start():
    named = commands(text(README), "make")
    assert {"fit", "test", "test-quick", "tensorboard"} <= named
    assert ". .venv/bin/activate" in text(README)


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_config_file_named_exists(page):
    for name in set(re.findall(r"configs/[\w./-]*\.yaml", text(page))):
        if "*" not in name:
            assert (ROOT / name).is_file(), f"{page.relative_to(ROOT)} names {name}: no such file"


def test_the_readme_tables_every_config_file():
    first_cells = re.findall(r"^\| (.+?) \|", section(README, "Configs and run folders"), flags=re.M)
    tabled = {name for cell in first_cells for name in re.findall(r"`([\w-]+\.yaml)`", cell)}
    on_disk = {p.name for p in (ROOT / "configs").glob("*.yaml")}
    assert tabled - {"base.yaml"} <= on_disk and on_disk <= tabled | {"base.yaml"}, (tabled, on_disk)


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_python_module_named_exists(page):
    for module in set(re.findall(r"python -m (loopnet[\w.]*)", text(page))):
        path = ROOT / module.replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), (
            f"{page.relative_to(ROOT)} names `python -m {module}`: no such module"
        )


def test_the_code_tour_links_the_files_to_read_first():
    tour = re.findall(r"\]\((loopnet/[\w/]+\.py)\)", section(README, "Code tour"))
    assert len(tour) >= 8, tour  # each one's existence: test_every_relative_link_resolves


def test_the_readme_is_a_front_page():
    lines = text(README).count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move detail into a page in docs/"


def test_every_sweep_key_is_documented():
    rows = set(re.findall(r"^\| `(\w+)` \|", section(ROOT / "docs/studies.md", "Sweep files"), flags=re.M))
    assert rows == SWEEP_KEYS


def test_the_eval_examples_folders_exist():
    folders = re.findall(r"cd (\S+) && loopnet eval", text(ROOT / "docs/evaluation.md"))
    assert folders
    for folder in folders:
        assert (ROOT / folder).is_dir(), folder
