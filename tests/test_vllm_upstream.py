"""vLLM 0.32.0's own tests, run against vLLM with decodebench's plugins loaded (run with `tox -e vllm`).

vLLM's source distribution on PyPI ships its test suite. The test run fetches it once into the decodebench cache
(checked against its sha256), and runs, in a process started as a vLLM process starts (tests/vllm_boot.py), the
rejection sampler's tests (every rule of vLLM's standard speculative sampling, which the plugin's wrapper must leave
as it is) and the logits-processor loader tests (which isolate themselves from installed entry points: the real
entry points are loaded by tests/test_vllm_processor.py). One is left out: the rejection sampler's statistical test
(two draft tokens, 10 to 100,000 draws over a vocabulary of 10: most of the suite's time here), whose property with
the plugin loaded, standard requests still follow the target distribution, tests/test_mtad_vllm.py checks on the
same patched sampler in one case (one draft token from q, 20,000 draws: total variation from p under 0.02); the
file's other 74 tests still check that the plugin leaves vLLM's rule as it is."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, explain, run_command

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)

SDIST = (
    "https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/"
    "vllm-0.32.0.tar.gz"
)
SHA256 = "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
ROOT = "vllm-0.32.0/"
# the test files run, and what they need of the suite (its packages and helpers)
TESTS = (
    "tests/v1/sample/test_rejection_sampler.py",
    "tests/v1/logits_processors/test_loader.py",
    "tests/v1/worker/test_logits_processor_loader.py",
)
# by name: the ids pytest gives these files depend on the folder it takes for the root (the cache may lie in a checkout)
LEFT_OUT = ("-k", "not test_rejection_sampling_approximates_target_distribution")
SUPPORT = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/sample/__init__.py",
    "tests/v1/sample/utils.py",
    "tests/v1/logits_processors/__init__.py",
    "tests/v1/worker/__init__.py",
)


def vllm_test_suite() -> Path:
    """The part of vLLM 0.32.0's test suite these tests run, extracted once under the decodebench cache."""
    from filelock import FileLock

    from decodebench.data.paths import home

    target = home() / "vllm-0.32.0-tests"
    done = target / ".complete"
    if done.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if done.exists():
            return target
        archive = target / "vllm-0.32.0.tar.gz"
        if not archive.exists() or hashlib.sha256(archive.read_bytes()).hexdigest() != SHA256:
            with urllib.request.urlopen(SDIST, timeout=120) as response:
                data = response.read()
            digest = hashlib.sha256(data).hexdigest()
            assert digest == SHA256, f"vLLM 0.32.0's source distribution has sha256 {digest}, not {SHA256}"
            archive.write_bytes(data)
        with tarfile.open(archive) as sdist:
            for name in (*TESTS, *SUPPORT):
                member = sdist.getmember(ROOT + name)
                member.name = name
                sdist.extract(member, target, filter="data")
        archive.unlink()
        done.touch()
    return target


def test_vllms_own_sampler_and_loader_tests_pass_with_decodebenchs_plugins_loaded(tmp_path):
    suite = vllm_test_suite()
    command = [sys.executable, "-m", "pytest", "-p", "vllm_boot", "--noconftest", "-p", "no:cacheprovider"]
    proc = run_command(
        [*command, *LEFT_OUT, *TESTS],
        cwd=suite,
        PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(suite)]),
    )
    assert proc.returncode == 0, explain(proc)
    assert "decodebench plugins: verification rules active, CPU fix True" in proc.stdout, proc.stdout[:2000]
    passed = int(re.search(r"(\d+) passed", proc.stdout).group(1))
    assert passed >= 89 and " failed" not in proc.stdout and "1 deselected" in proc.stdout, proc.stdout[-2000:]
