"""The README says what the code does: the methods' argument tables, the tox environments it names,
and the layout of the wheel (no study or benchmark script in it)."""

from __future__ import annotations

import configparser
import re
import zipfile

from conftest import REPO


def test_the_methods_tables_are_the_configs_own():
    from decodebench.commands.cli import methods_markdown
    from decodebench.models.registry import METHODS, load_method

    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- methods: start", 1)[1].split("-->", 1)[1].split("<!-- methods: end -->")[0]
    assert block.strip() == methods_markdown([load_method(t) for t in METHODS.values()]).strip()


def test_every_tox_environment_the_readme_names_exists():
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "tox.ini")
    envs = {section.removeprefix("testenv:") for section in config.sections() if section.startswith("testenv:")}
    envs |= {"py"}
    named = set()
    for command in re.findall(r"tox (?:p )?-e ([a-z][\w,.-]*)", (REPO / "README.md").read_text()):
        named |= set(command.split(","))
    assert named and named <= envs, f"the README names tox envs that tox.ini lacks: {sorted(named - envs)}"


def test_the_wheel_holds_the_package_but_no_study_or_benchmark(decodebench_wheel):
    wheel = decodebench_wheel
    names = zipfile.ZipFile(wheel).namelist()
    assert "decodebench/models/lz/method.py" in names and "decodebench/infinigram_index.py" in names
    assert not [n for n in names if "studies" in n or "bench" in n.split("/")[1:2] or n.startswith("tests/")]
