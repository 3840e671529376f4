"""vLLM 0.32.0's own tests, as tests/test_vllm_upstream.py runs them: fetched once from its source distribution, and
the command that runs them (started by conftest beside the other tests)."""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

TESTS_FOLDER = Path(__file__).resolve().parent

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


def own_tests_command() -> tuple[list[str], Path, dict[str, str]]:
    """pytest on TESTS less LEFT_OUT, in a process started as a vLLM process starts (tests/vllm_boot.py): the command,
    its working folder and the environment it adds."""
    suite = vllm_test_suite()
    command = [sys.executable, "-m", "pytest", "-p", "vllm_boot", "--noconftest", "-p", "no:cacheprovider"]
    return [*command, *LEFT_OUT, *TESTS], suite, {"PYTHONPATH": os.pathsep.join([str(TESTS_FOLDER), str(suite)])}
