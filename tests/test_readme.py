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


def tox_config() -> configparser.ConfigParser:
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "tox.ini")
    return config


def commands_named() -> str:
    """The README's text and docs/studies.md's: where a user finds the commands to run."""
    return (REPO / "README.md").read_text() + "\n" + (REPO / "docs" / "studies.md").read_text()


def test_every_tox_environment_the_readme_names_exists():
    config = tox_config()
    envs = {section.removeprefix("testenv:") for section in config.sections() if section.startswith("testenv:")}
    envs |= {"py"}
    named = set()
    for command in re.findall(r"tox (?:p )?-e ([a-z][\w,.-]*)", commands_named()):
        named |= set(command.split(","))
    assert named and named <= envs, f"the README names tox envs that tox.ini lacks: {sorted(named - envs)}"


def test_a_combined_tox_commands_arguments_reach_only_its_last_environment():
    """`tox -e kvpress,nugget-study -- ARGS` hands ARGS to every env it names: the ones before the study must not
    read them (the kvpress env's pytest stopped on the study's --doc, so the documented command never ran)."""
    config = tox_config()
    combined = re.findall(r"tox -e ([a-z][\w.-]*(?:,[a-z][\w.-]*)+) -- ", commands_named())
    assert combined
    for envs in combined:
        for env in envs.split(",")[:-1]:
            commands = config[f"testenv:{env}"].get("commands", "")
            assert "{posargs" not in commands, f"`tox -e {envs} -- ...` hands its arguments to {env}: {commands}"


def test_the_wheel_holds_the_package_but_no_study_or_benchmark(decodebench_wheel):
    wheel = decodebench_wheel
    names = zipfile.ZipFile(wheel).namelist()
    assert "decodebench/models/lz/method.py" in names and "decodebench/data/infinigram_index.py" in names
    assert not [n for n in names if "studies" in n or "bench" in n.split("/")[1:2] or n.startswith("tests/")]


def test_each_study_row_names_the_command_that_wrote_its_page():
    """docs/studies.md's command for a page has the arguments the page says it was written with (--out aside): a
    reader who runs the row reruns that page's study, not another one under the same page name."""
    studies = (REPO / "docs" / "studies.md").read_text()
    rows = re.findall(r"^\| `tox (?:p )?-e [\w,.-]+(?: -- ([^`]*))?` \| `(docs/[\w/.-]+\.md)`", studies, re.M)
    checked = []
    for arguments, page in rows:
        header = re.search(r"^Written by `python studies/\w+\.py([^`]*)`", (REPO / page).read_text(), re.M)
        if header is None:  # the GPU page names each section's command instead, in its own header
            continue
        written = re.sub(r" --out \S+", "", header.group(1)).split()
        assert arguments.split() == written, f"docs/studies.md's row for {page} runs {arguments!r}, not {written}"
        checked.append(page)
    assert len(checked) >= 15, checked
