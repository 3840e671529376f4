"""vLLM's own tests, run against vLLM with decodebench's plugins loaded (run with `tox -e vllm`): 0.32.0's on the
installed CPU build, and 0.33.0's over its Python files (tests/vllm_suite.py: no CPU build of 0.33 exists yet).

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

import importlib.util
import os
import re

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)


def test_vllms_own_sampler_and_loader_tests_pass_with_decodebenchs_plugins_loaded(vllm_own_tests):
    """Their run (tests/vllm_suite.py) starts beside the other tests once they are collected: ~30 s of one core."""
    output = vllm_own_tests
    assert "decodebench plugins on vLLM 0.32.0: verification rules active, CPU fix True" in output, output[:2000]
    passed = int(re.search(r"(\d+) passed", output).group(1))
    assert passed >= 89 and " failed" not in output and "1 deselected" in output, output[-2000:]


def test_the_next_release_runs_its_own_tests_and_decodebenchs_rules_over_its_python_files(vllm_next_tests):
    """vLLM 0.33.0 (no CPU build yet: its Python files over the installed CPU build's compiled parts, tests/
    vllm_suite.py): its own rejection-sampler and logits-processor tests pass with decodebench's plugins loaded, and so
    do decodebench's MTAD and block unit tests (tests/test_mtad_vllm.py, tests/test_vllm_releases.py)."""
    own, rules = vllm_next_tests
    assert "on vLLM 0.33.0: verification rules active, CPU fix True" in own, own[:2000]
    passed = int(re.search(r"(\d+) passed", own).group(1))
    assert passed >= 88 and " failed" not in own and " error" not in own, own[-3000:]
    assert "vllm 0.33.0" in rules, rules[:2000]
    passed = int(re.search(r"(\d+) passed", rules).group(1))
    assert passed >= 25 and " failed" not in rules and " error" not in rules, rules[-3000:]
