"""The README says what the code does, briefly: the install and both command lines first, no run logs, the tox
environments it names exist; docs/methods.md holds the methods' argument tables as the configs define them; the
wheel holds no study or benchmark script."""

from __future__ import annotations

import configparser
import re
import zipfile

from conftest import REPO


def test_the_methods_tables_are_the_configs_own():
    from decodebench.commands.cli import methods_markdown
    from decodebench.models.registry import METHODS, load_method

    readme = (REPO / "docs" / "methods.md").read_text()
    block = readme.split("<!-- methods: start", 1)[1].split("-->", 1)[1].split("<!-- methods: end -->")[0]
    assert block.strip() == methods_markdown([load_method(t) for t in METHODS.values()]).strip()


# README lines 1 and 2 of the project: what .ci/run runs, in this order
COMMAND_LINES = (
    "python3 -m pip install tox && tox -e demo",
    "python3 -m pip install tox && tox p -e lint,py,vllm",
)


def test_the_readme_is_reference_with_install_and_both_command_lines_first():
    """At most 300 lines; the two command lines and the install within the first 60; no dated timings, commit hashes
    or run logs (a figure lives on the page its command writes, which the README links to)."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines"
    head = lines[:60]
    for command in COMMAND_LINES:
        assert command in head, f"{command!r} is not among the README's first 60 lines"
    assert "## Install" in head and any(line.startswith("pip install -e") for line in head)
    ci = (REPO / ".ci" / "run").read_text()
    assert [c for c in COMMAND_LINES if c in ci] == list(COMMAND_LINES)  # CI runs the README's lines
    dated = [line for line in lines if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    hashes = [line for line in lines if re.search(r"(?<![\w/.-])[0-9a-f]{7,12}(?![\w.-])", line)]
    assert not dated and not hashes, f"run logs in the README: {(dated + hashes)[:3]}"


def test_every_tox_environment_the_readme_names_exists():
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "tox.ini")
    envs = {section.removeprefix("testenv:") for section in config.sections() if section.startswith("testenv:")}
    envs |= {"py"}
    named = set()
    texts = [(REPO / "README.md").read_text(), (REPO / "docs" / "studies.md").read_text()]
    for command in re.findall(r"tox (?:p )?-e ([a-z][\w,.-]*)", "\n".join(texts)):
        named |= set(command.split(","))
    assert named and named <= envs, f"the README names tox envs that tox.ini lacks: {sorted(named - envs)}"


def test_the_wheel_holds_the_package_but_no_study_or_benchmark(decodebench_wheel):
    wheel = decodebench_wheel
    names = zipfile.ZipFile(wheel).namelist()
    assert "decodebench/models/lz/method.py" in names and "decodebench/data/infinigram_index.py" in names
    assert not [n for n in names if "studies" in n or "bench" in n.split("/")[1:2] or n.startswith("tests/")]
