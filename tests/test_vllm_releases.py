"""Which vLLM releases decodebench's vLLM plugins run on (models/vllm_releases.py), run with `tox -e vllm`: on the
installed vLLM and, through tests/vllm_suite.py's overlay, on the next release's Python files. A release outside the
validated series, or a vLLM that changed a function the plugins wrap, is refused by name and wraps nothing."""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)


@pytest.fixture
def fresh_refusal():
    """verification_refusal is decided once a process: cleared around a test that changes what it reads."""
    from decodebench.models.vllm_releases import verification_refusal

    verification_refusal.cache_clear()
    yield
    verification_refusal.cache_clear()


def test_this_vllm_is_validated_and_admits_mtad_and_block_requests():
    """The installed release (and, in the overlay run, the next one) is in a validated series, every function the
    plugins wrap or replace has a validated signature, and requests asking for the rules are admitted."""
    import vllm
    from vllm import SamplingParams

    from decodebench.models.mtad.vllm_requests import Rule, requested_rule
    from decodebench.models.vllm_releases import (
        CPU_FIX_INTERNALS,
        VALIDATED_SERIES,
        VERIFICATION_INTERNALS,
        changed_internals,
        series,
        verification_refusal,
    )

    assert series(vllm.__version__) in VALIDATED_SERIES
    assert changed_internals(VERIFICATION_INTERNALS) == [] and changed_internals(CPU_FIX_INTERNALS) == []
    assert verification_refusal() is None
    assert requested_rule(SamplingParams(temperature=1.0, extra_args={"mtad_tau": 0.1})) == Rule("mtad", 0.1)
    assert requested_rule(SamplingParams(temperature=1.0, extra_args={"block_verify": True})) == Rule("block")


def test_a_release_outside_the_validated_series_is_refused_by_name():
    from decodebench.models.vllm_releases import VERIFICATION_INTERNALS, release_refusal

    refusal = release_refusal(VERIFICATION_INTERNALS, "the rules", version="0.34.0")
    assert refusal == "the rules were validated against vLLM 0.32.x, 0.33.x and this is vLLM 0.34.0"
    assert release_refusal(VERIFICATION_INTERNALS, "the rules", version="0.31.2+cpu").endswith("vLLM 0.31.2+cpu")


def test_a_changed_signature_of_a_wrapped_function_is_refused_by_name(monkeypatch, fresh_refusal):
    """vLLM moving or adding an argument of ``rejection_sample`` (as 0.33 did, with defaults) would let the wrapper
    read the wrong thing: a signature not validated refuses every MTAD and block request, naming the function, what it
    is now and what was validated; requests that ask for neither run as before."""
    from vllm import SamplingParams
    from vllm.v1.sample import rejection_sampler

    from decodebench.models.mtad.vllm_requests import requested_rule

    def rejection_sample(draft_token_ids, num_draft_tokens, sampling_metadata, target_logits, new_required):
        raise AssertionError("never called")

    monkeypatch.setattr(rejection_sampler, "rejection_sample", rejection_sample)
    with pytest.raises(ValueError) as refused:
        requested_rule(SamplingParams(temperature=1.0, extra_args={"mtad_tau": 0.1}))
    message = str(refused.value)
    assert "vllm.v1.sample.rejection_sampler.rejection_sample(draft_token_ids, num_draft_tokens, " in message
    assert "new_required) (validated: (draft_token_ids" in message
    assert "requests that ask for them are refused" in message
    assert requested_rule(SamplingParams(temperature=1.0)) is None


def test_a_function_gone_is_refused_by_name(monkeypatch):
    from vllm.v1.spec_decode import llm_base_proposer

    from decodebench.models.vllm_releases import VERIFICATION_INTERNALS, changed_internals

    monkeypatch.delattr(llm_base_proposer, "compute_probs_and_sample_next_token")
    (gone,) = changed_internals(VERIFICATION_INTERNALS)
    assert gone.startswith("vllm.v1.spec_decode.llm_base_proposer.compute_probs_and_sample_next_token is gone")


def test_an_engine_asking_block_verification_of_the_v1_runner_where_the_rules_cannot_run_is_stopped(monkeypatch):
    """vLLM's V1 runner ignores ``rejection_sample_method="block"``: where decodebench cannot put block verification
    in (a refused release), the engine stops as it builds its processors, saying why, instead of silently verifying
    by vLLM's standard rule; an engine that asks for nothing keeps serving."""
    import torch
    from vllm.config import VllmConfig

    from decodebench.models.mtad import vllm_v1_rules

    monkeypatch.setattr(vllm_v1_rules, "version_refusal", lambda: "the rules were validated against vLLM 0.32.x")
    monkeypatch.setattr(vllm_v1_rules, "engine_refusal", lambda config: "the rules were validated against vLLM 0.32.x")
    config = VllmConfig()
    config.speculative_config = SimpleNamespace(rejection_sample_method="block")
    with pytest.raises(ValueError, match=r"asks rejection_sample_method='block' of vLLM's V1 runner: the rules were"):
        vllm_v1_rules.VerificationRequestsV1(config, torch.device("cpu"), False)
    vllm_v1_rules.VerificationRequestsV1(VllmConfig(), torch.device("cpu"), False)
