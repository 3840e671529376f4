"""The LZ penalty's vLLM logits processors without an engine, on both of vLLM's model runners: vLLM 0.32.0's own
loaders build what decodebench registers; the V1 processor follows random add/remove/move/swap sequences from vLLM's
own BatchUpdateBuilder, each batch row checked against its own request; the V2 processor, driven through its
interface on vLLM's own request state, gives the kernel's penalty for every row's history (speculative positions
included) and the V1 processor's where both apply."""

from __future__ import annotations

import importlib.util
import math
import os
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from lz_reference import authors_codelengths, codelengths
from persistent_batch import PersistentBatch

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None and not os.environ.get("DECODEBENCH_REQUIRE_VLLM"):
    pytest.skip("vLLM is not installed (run `tox -e vllm`)", allow_module_level=True)

V = 11


def lz_request(rng: random.Random):
    """A request's SamplingParams and its LZ settings (None: it does not ask for the penalty)."""
    from vllm import SamplingParams

    from decodebench.models.lz.request_args import lz_extra_args

    config = random_config(rng)
    return SamplingParams(extra_args=lz_extra_args(config) if config else None), config


def random_config(rng: random.Random):
    """Settings of a request: most ask for the penalty, with one of several sizes and codelengths; others do not."""
    from decodebench.models.lz import LZConfig

    if rng.random() >= 0.7:
        return None
    return LZConfig(
        strength=rng.choice([0.15, 1.0, 3.0]),
        window=rng.choice([6, 12]),
        buffer=rng.choice([2, 3]),
        include_prompt=rng.random() < 0.5,
        codelength=rng.choice(["authors", "propositions"]),
    )


def expected_row(request: dict, logits: torch.Tensor) -> torch.Tensor:
    """The penalty for one request alone, from the plain references of each codelength's definition."""
    config = request["config"]
    if config is None or config.strength == 0:
        return logits
    history = (request["prompt"] if config.include_prompt else []) + request["output"]
    history = history[-config.window :]
    if not history:
        return logits
    reference = authors_codelengths if config.codelength == "authors" else codelengths
    costs = torch.tensor(reference(history, V, config.window, config.buffer))
    present = torch.zeros(V, dtype=torch.bool)
    present[history] = True
    # absent tokens all cost log2 V: the processor leaves them alone (a constant shift per row)
    delta = torch.where(present, costs - math.log2(V), torch.zeros(V))
    return logits + config.strength * delta


@pytest.mark.parametrize("seed", range(5))
def test_processor_follows_batch_updates_and_matches_each_request_alone(seed):
    from decodebench.models.lz.vllm_v1_processor import LZPenaltyV1LogitsProcessor

    rng = random.Random(seed)
    processor = LZPenaltyV1LogitsProcessor(None, torch.device("cpu"), False)
    batch = PersistentBatch(rng, lz_request, V)
    checked = 0
    for _ in range(60):
        processor.update_state(batch.step())
        if not batch.rows:
            continue
        logits = torch.randn(len(batch.rows), V, generator=torch.Generator().manual_seed(rng.randrange(10**6)))
        got = processor.apply(logits.clone())
        for row, request in enumerate(batch.rows):
            assert torch.allclose(got[row], expected_row(request, logits[row]), atol=1e-5), (row, request)
            checked += 1
        for row, request in enumerate(batch.rows):  # vLLM appends each sampled token to the live output list
            request["output"].append(int(got[row].argmax()) if rng.random() < 0.5 else rng.randrange(V))
    assert checked > 100


def test_bad_per_request_settings_are_refused_with_the_allowed_ones():
    from vllm import SamplingParams

    from decodebench.models.lz.vllm_processor import LZPenaltyLogitsProcessor

    def check(**extra):
        LZPenaltyLogitsProcessor.validate_params(SamplingParams(extra_args=extra))

    with pytest.raises(ValueError, match=r"unknown LZ penalty settings \['lz_alpha'\]"):
        check(lz_penalty=0.15, lz_alpha=1)
    with pytest.raises(ValueError, match=r"strength=-1\.0: must be >= 0"):
        check(lz_penalty=-1.0)
    with pytest.raises(ValueError, match="without lz_penalty"):
        check(lz_window=64)
    with pytest.raises(ValueError, match="codelength='paper' is not allowed"):
        check(lz_penalty=0.15, lz_codelength="paper")
    check(other_processor_setting=1)  # keys of other processors are none of ours
    check(lz_penalty=0.15, lz_window=64, lz_include_prompt="true")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"max_model_len": "abc"}, "max_model_len='abc': vLLM's engine argument max_model_len takes an integer"),
        ({"gpu_memory_utilization": "nan"}, "gpu_memory_utilization='nan': vLLM's engine argument"),
        ({"dtype": "fp64"}, r"dtype='fp64': vLLM's engine argument dtype takes one of \['auto'"),
        ({"enforce_eager": "maybe"}, "enforce_eager='maybe': vLLM's engine argument enforce_eager takes true or false"),
    ],
)
def test_engine_arguments_of_the_wrong_kind_are_named_before_the_engine_starts(args, message):
    from decodebench.models.baseline import Baseline

    with pytest.raises(ValueError, match=message):
        Baseline.check_args({"backend": "vllm", **args})
    Baseline.check_args({"backend": "vllm", "max_model_len": 2048.0, "enforce_eager": True, "dtype": "float32"})


# -- both model runners --------------------------------------------------------------------------------------------
@pytest.fixture
def cpu_buffers(monkeypatch):
    """vLLM's V2 buffers on this machine's CPU: vLLM 0.32.0 reports UVA available on the CPU build, then fails to pin
    memory; its own fallback (device copies, here CPU tensors) is what a platform without UVA gets."""
    from vllm.v1.worker.gpu import buffer_utils

    monkeypatch.setattr(buffer_utils, "is_uva_available", lambda: False)


def request_state(slots: int, length: int, spec: int):
    """vLLM's V2 runner's own request state, on CPU tensors, and what processors see of it."""
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcRequestState
    from vllm.v1.worker.gpu.states import RequestState

    state = RequestState(slots, length, 64, spec, V, torch.device("cpu"), use_dense_all_token_ids=True)
    return state, LogitsProcRequestState.from_request_state(state)


def test_vllms_own_loaders_build_what_decodebench_registers_on_either_runner(cpu_buffers, monkeypatch):
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1Processor
    from vllm.v1.sample.logits_processor import build_logitsprocs
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2Processor
    from vllm.v1.worker.gpu.sample.logits_processor import loader

    from decodebench.models.lz.vllm_processor import LZPenaltyLogitsProcessor
    from decodebench.models.mtad.vllm_plugin import VerificationRequests, register

    register()  # as every vLLM process does before its engine starts (vllm.general_plugins)
    loader._cached_load_v2_logitsprocs.cache_clear()
    # the V2 runner's loader (it raised ValueError naming decodebench_lz before) and its constructor
    classes = loader._load_v2_logitsprocs_plugins()
    assert {LZPenaltyLogitsProcessor, VerificationRequests} <= set(classes)
    _, states = request_state(4, 64, 0)
    built = loader.build_custom_logits_processors(VllmConfig(), states, False)
    assert {type(p) for p in built} >= {LZPenaltyLogitsProcessor, VerificationRequests}
    assert all(isinstance(p, V2Processor) for p in built)
    # the V1 runner's: the same entry points build the V1 twins
    names = {type(p).__name__ for p in build_logitsprocs(VllmConfig(), torch.device("cpu"), False, False).all}
    assert {"LZPenaltyV1LogitsProcessor", "VerificationRequestsV1"} <= names
    assert all(isinstance(p, V1Processor) for p in build_logitsprocs(VllmConfig(), "cpu", False, False).all)
    # the input processor's per-request check, on each runner: LZ's arguments checked alike on both (a V2 engine's
    # config cannot be made here, where V2 needs Triton: what the check reads of it)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    for config in (VllmConfig(), SimpleNamespace(use_v2_model_runner=True, speculative_config=None)):
        frontend = SimpleNamespace(
            vllm_config=config, model_config=SimpleNamespace(logits_processors=None, runner_type="generate")
        )
        validate = InputProcessor._build_logits_processors_params_validator(frontend)
        validate(SamplingParams(extra_args={"lz_penalty": 0.2, "lz_window": 64}))
        with pytest.raises(VLLMValidationError, match=r"window=3: must be"):
            validate(SamplingParams(extra_args={"lz_penalty": 0.2, "lz_window": 3}))


def test_the_registered_modules_keep_vllms_frontend_light():
    """vLLM's frontend imports every registered processor to check requests; vLLM keeps that import free of the
    model runners' machinery, and so do decodebench's modules."""
    code = (
        "import sys\n"
        "import decodebench.models.lz.vllm_processor, decodebench.models.mtad.vllm_plugin\n"
        "heavy = [m for m in ('vllm.v1.sample.logits_processor', 'vllm.v1.worker.gpu.states',\n"
        "         'vllm.v1.worker.gpu.buffer_utils', 'vllm.v1.sample.rejection_sampler') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def penalized_by_kernel(logits, history: list[int], config) -> torch.Tensor:
    """One row's penalty from kernels/lz.py on its history alone."""
    from decodebench.kernels.lz import apply_lz_penalty_

    window = history[-config.window :] or [0]
    return apply_lz_penalty_(
        logits.clone()[None],
        torch.tensor([window]),
        torch.tensor([min(len(history), config.window)]),
        config.strength,
        config.window,
        config.buffer,
        config.codelength,
    )[0]


@pytest.mark.parametrize("seed", range(4))
def test_the_v2_processor_penalizes_every_rows_history_as_the_kernel_and_the_v1_processor_do(cpu_buffers, seed):
    """Random batches on vLLM's V2 request state: requests in random slots, some asking for LZ with other settings,
    committed tokens in ``all_token_ids``, 0-3 draft tokens each (one logits row per draft position, the drafts in
    ``input_ids``). Every row equals the kernel on that row's history; the rows without drafts equal the V1 processor
    on the same requests."""
    import numpy as np
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.v1.sample.logits_processor import BatchUpdate
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

    from decodebench.models.lz.request_args import lz_extra_args
    from decodebench.models.lz.vllm_processor import LZPenaltyLogitsProcessor

    rng = random.Random(seed)
    state, states = request_state(8, 96, 3)
    v2 = LZPenaltyLogitsProcessor(VllmConfig(), states)
    checked = 0
    for _ in range(15):
        slots = rng.sample(range(8), rng.randint(1, 8))
        requests = []
        for slot in slots:
            config = random_config(rng)
            prompt = [rng.randrange(V) for _ in range(rng.randint(1, 8))]
            output = [rng.randrange(4) for _ in range(rng.randint(1, 30))]  # a small alphabet: many matches
            drafts = [rng.randrange(4) for _ in range(rng.randint(0, 3))]
            state.all_token_ids.gpu[slot, : len(prompt) + len(output)] = torch.tensor(prompt + output)
            state.total_len.gpu[slot] = len(prompt) + len(output)
            state.prompt_len.np[slot] = len(prompt)
            params = SamplingParams(extra_args=lz_extra_args(config) if config else None)
            v2.add_request(slot, params)
            requests.append((slot, config, prompt, output, drafts, params))
        state.prompt_len.copy_to_uva()
        v2.apply_staged_writes()
        rows, local, inputs = [], [], []
        for slot, _, _, output, drafts, _ in requests:
            for k in range(len(drafts) + 1):
                rows.append(slot)
                local.append(k)
                inputs.append(output[-1] if k == 0 else drafts[k - 1])
        ctx = LogitsContext(
            expanded_idx_mapping=torch.tensor(rows, dtype=torch.int32),
            idx_mapping=torch.tensor(slots, dtype=torch.int32),
            idx_mapping_np=np.array(slots, dtype=np.int32),
            expanded_local_pos=torch.tensor(local, dtype=torch.int32),
            input_ids=torch.tensor(inputs, dtype=torch.int32),
            pos=torch.zeros(len(rows), dtype=torch.int64),
            seq_lens_upper_bound_np=np.zeros(len(slots), dtype=np.int32),
        )
        logits = torch.randn(len(rows), V, generator=torch.Generator().manual_seed(rng.randrange(10**6)))
        got = v2.apply(logits.clone(), ctx)
        row = 0
        for _, config, prompt, output, drafts, _ in requests:
            for k in range(len(drafts) + 1):
                if config is None:
                    assert torch.equal(got[row], logits[row])
                else:
                    history = (prompt if config.include_prompt else []) + output + drafts[:k]
                    assert torch.allclose(got[row], penalized_by_kernel(logits[row], history, config), atol=1e-5)
                    checked += 1
                row += 1
        # the V1 processor on the same requests (rows without drafts: the V1 runner applies none under speculation)
        v1 = LZPenaltyLogitsProcessor(VllmConfig(), torch.device("cpu"), False)
        added = [(i, params, prompt, output) for i, (_, _, prompt, output, _, params) in enumerate(requests)]
        v1.update_state(BatchUpdate(len(requests), [], added, []))
        first_rows = [rows_before for rows_before in np.cumsum([0] + [len(r[4]) + 1 for r in requests])[:-1]]
        assert torch.allclose(v1.apply(logits[first_rows].clone()), got[first_rows], atol=1e-5)
    assert checked > 100


def test_a_v2_step_makes_no_host_synchronization(cpu_buffers):
    """Two groups of settings and a request without the penalty in one batch, drafts included: which requests asked
    is read on the host, the rows of each group are found on the device, nothing waits for it."""
    import numpy as np
    from host_syncs import HostSyncs
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

    from decodebench.models.lz.vllm_processor import LZPenaltyLogitsProcessor

    state, states = request_state(4, 64, 2)
    v2 = LZPenaltyLogitsProcessor(VllmConfig(), states)
    settings = {0: {"lz_penalty": 0.5, "lz_window": 8, "lz_buffer": 2}, 1: None, 2: {"lz_penalty": 1, "lz_buffer": 2}}
    for slot, extra in settings.items():
        state.all_token_ids.gpu[slot, :12] = torch.arange(12) % 4
        state.total_len.gpu[slot] = 12
        state.prompt_len.np[slot] = 3
        v2.add_request(slot, SamplingParams(extra_args=extra))
    state.prompt_len.copy_to_uva()
    v2.apply_staged_writes()
    rows, local = [0, 0, 0, 1, 2, 2], [0, 1, 2, 0, 0, 1]
    ctx = LogitsContext(
        expanded_idx_mapping=torch.tensor(rows, dtype=torch.int32),
        idx_mapping=torch.tensor([0, 1, 2], dtype=torch.int32),
        idx_mapping_np=np.array([0, 1, 2], dtype=np.int32),
        expanded_local_pos=torch.tensor(local, dtype=torch.int32),
        input_ids=torch.tensor([3, 1, 2, 3, 3, 0], dtype=torch.int32),
        pos=torch.zeros(6, dtype=torch.int64),
        seq_lens_upper_bound_np=np.zeros(3, dtype=np.int32),
    )
    logits = torch.randn(6, V)
    with HostSyncs() as counter:
        got = v2.apply(logits.clone(), ctx)
    assert counter.calls == []
    assert torch.equal(got[3], logits[3]) and not torch.equal(got[0], logits[0]) and not torch.equal(got[5], logits[5])


def test_lz_with_speculation_asks_for_the_v2_runner_and_is_refused_where_there_is_none():
    """vLLM's V1 runner applies no custom processor in an engine that speculates; the V2 runner does, and needs
    Triton (a GPU build): on the CPU build the run is refused before the engine starts, saying both."""
    from decodebench.models.lz import LZ

    with pytest.raises(ValueError, match=r"only vLLM's V2 model runner applies one.*needs Triton"):
        LZ.check_args({"backend": "vllm", "pretrained": "embedded", "speculative_config": {"method": "ngram"}})
    frequency = {"backend": "vllm", "pretrained": "embedded", "penalty": "frequency", "speculative_config": {}}
    LZ.check_args(frequency)  # vLLM's own penalties work on either runner
