"""Which of vLLM's model runners an engine decodebench starts runs on: what is asked, what the method needs, and the
environment, checked before anything starts (models/model_runners.py); and the processors' construction under each
runner's arguments."""

from __future__ import annotations

import pytest

from decodebench.models.model_runners import RUNNER_ENV, BothRunners, RunnerNeed, runner_environment

V1_ONLY = RunnerNeed("v1", "MTAD's rule lives there")
V1_PREFERRED = RunnerNeed("v1", "the modes compare on one runner", required=False)


def test_auto_takes_what_the_method_needs_and_otherwise_leaves_vllms_choice(monkeypatch):
    monkeypatch.delenv(RUNNER_ENV, raising=False)
    assert runner_environment("auto", None) == {}
    assert runner_environment("auto", V1_ONLY) == {RUNNER_ENV: "0"}
    assert runner_environment("auto", V1_PREFERRED) == {RUNNER_ENV: "0"}
    assert runner_environment("v1", None) == {RUNNER_ENV: "0"}


def test_a_contradiction_names_both_sides_before_anything_starts(monkeypatch):
    monkeypatch.delenv(RUNNER_ENV, raising=False)
    with pytest.raises(ValueError, match="model_runner=v2: MTAD's rule lives there, so it needs model_runner=v1"):
        runner_environment("v2", V1_ONLY)
    with pytest.raises(ValueError, match=r"model_runner='v3': one of \['auto', 'v1', 'v2'\]"):
        runner_environment("v3", None)
    monkeypatch.setenv(RUNNER_ENV, "1")
    with pytest.raises(
        ValueError, match=f"{RUNNER_ENV}=1 is set, but MTAD's rule lives there: unset it, or set it to 0"
    ):
        runner_environment("auto", V1_ONLY)
    # a runner the method only prefers gives way to the user's own choice
    assert runner_environment("auto", V1_PREFERRED) == {}


def test_a_processor_for_both_runners_builds_its_v1_twin_from_v1s_arguments():
    class Twin:
        def __init__(self, vllm_config, device, is_pin_memory):
            self.args = (vllm_config, device, is_pin_memory)

    class Processor(BothRunners):
        v1_twin = f"{__name__}:TWIN"

        def __init__(self, vllm_config, req_states):
            self.req_states = req_states

    globals()["TWIN"] = Twin
    v1 = Processor("config", "cpu", False)  # the V1 runner: (vllm_config, device, is_pin_memory)
    v2 = Processor("config", "states")  # the V2 runner: (vllm_config, req_states)
    assert isinstance(v1, Twin) and v1.args == ("config", "cpu", False)
    assert isinstance(v2, Processor) and v2.req_states == "states"


def test_decodebench_serve_starts_a_speculating_server_on_v1_and_says_what_contradicts(monkeypatch, capsys):
    from decodebench.commands.serve import run_serve, server_environment

    monkeypatch.delenv(RUNNER_ENV, raising=False)
    speculating = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']
    assert server_environment(speculating)[RUNNER_ENV] == "0"
    assert RUNNER_ENV not in server_environment(["--max-model-len", "1024"])
    monkeypatch.setenv(RUNNER_ENV, "1")
    assert run_serve(None, "127.0.0.1", 0, speculating, "v1") == 2
    assert f"{RUNNER_ENV}=1 is set, but decodebench's verification rules" in capsys.readouterr().err
