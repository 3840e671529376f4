"""A pytest plugin that starts a test session the way a vLLM process starts: the CPU build's kernel overrides (as
vLLM's worker registers them) and every installed ``vllm.general_plugins`` entry point, decodebench's among them.
Used to run vLLM's own tests (tests/test_vllm_upstream.py) with decodebench's plugins active."""

from __future__ import annotations


def pytest_configure(config):
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins

    if current_platform.is_cpu():
        current_platform.register_triton_kernel_overrides()
    load_general_plugins()


def pytest_report_header(config):
    import vllm
    from vllm.v1.sample import rejection_sampler

    from decodebench.models.backends import vllm_cpu_fix

    rules = getattr(rejection_sampler.rejection_sample, "_decodebench_verification", False)
    fixed = rejection_sampler._rejection_random_sample is vllm_cpu_fix.rejection_random_sample
    return (
        f"decodebench plugins on vLLM {vllm.__version__}: verification rules {'active' if rules else 'MISSING'}, "
        f"CPU fix {fixed}"
    )
