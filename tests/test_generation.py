"""Generation settings: refused before any work when no backend can honour them, recorded as run."""

from __future__ import annotations

import math

import pytest
from conftest import explain, fake_requests, results_files, run_lm_eval

from decodebench.models.decoding import GenerationSettingsError, check_generation_kwargs, decoding_record


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": math.nan}, "temperature=nan is not finite"),
        ({"temperature": -0.5}, "temperature=-0.5 is negative"),
        ({"temperature": "hot"}, "temperature='hot' is not a number"),
        ({"top_p": 0.0}, "top_p=0.0 is outside (0, 1]"),
        ({"top_p": 1.5}, "top_p=1.5 is outside (0, 1]"),
        ({"top_k": 2.5}, "top_k=2.5 must be a whole number"),
        ({"top_k": -3}, "top_k=-3 must be a whole number"),
        ({"max_gen_toks": 0}, "max_gen_toks=0 must be a whole number >= 1"),
        ({"max_new_tokens": math.inf}, "max_new_tokens=inf is not finite"),
        ({"do_sample": True, "temperature": 0}, "do_sample=true with temperature=0 samples nothing"),
        ({"do_sample": "yes"}, "do_sample='yes' must be true or false"),
        ({"until": ["\n", 3]}, "must be a string or a list of strings"),
    ],
)
def test_settings_no_backend_can_honour_are_refused_with_what_is_allowed(kwargs, message):
    with pytest.raises(GenerationSettingsError, match=r"^task t: ") as error:
        check_generation_kwargs(kwargs, "task t")
    assert message in str(error.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"until": ["\n\n"], "do_sample": False},
        {"do_sample": True, "temperature": 0.7, "top_p": 1, "top_k": 0},
        {"temperature": 0.0, "max_gen_toks": 32, "until": "\n"},
        {"top_k": -1, "max_new_tokens": 8.0},  # vLLM's "no top-k"; lm-eval's parser gives floats
    ],
)
def test_ordinary_settings_pass(kwargs):
    check_generation_kwargs(kwargs, "task t")


def test_decoding_records_name_only_the_warping_applied():
    assert decoding_record(False, 0.7, 20, 0.9) == {"do_sample": False}
    assert decoding_record(True, 0.7, 0, 1.0) == {"do_sample": True, "temperature": 0.7, "top_k": None, "top_p": None}
    assert decoding_record(True, 1, -1, 0.95) == {"do_sample": True, "temperature": 1.0, "top_k": None, "top_p": 0.95}


@pytest.mark.model
def test_results_say_how_each_task_was_decoded_with_the_defaults_transformers_added(tiny_checkpoint):
    from decodebench.models.baseline import Baseline
    from decodebench.models.nugget.method import Nugget

    model = Baseline.create({"pretrained": str(tiny_checkpoint), "device": "cpu"})
    prompts = ["Question: where is the bridge?\nAnswer:", "The river Alder"]
    model.generate_until(fake_requests(prompts, max_gen_toks=4))
    model.generate_until(fake_requests(prompts, max_gen_toks=4, do_sample=True, temperature=0.7))
    model.generate_until(fake_requests(prompts, max_gen_toks=4, do_sample=True, temperature=0.7, top_k=5, top_p=0.5))
    # the tiny model's generation_config sets nothing: transformers samples with its top-k 50
    assert model.decodebench_recorder.task_summaries()["t"]["decoding"] == [
        {"do_sample": False},
        {"do_sample": True, "temperature": 0.7, "top_k": 50, "top_p": None},
        {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.5},
    ]
    # a row-decoding method samples from the very same settings as its baseline
    nugget = Nugget.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": "delimiter"})
    nugget.generate_until(fake_requests(prompts, max_gen_toks=4, do_sample=True, temperature=0.7))
    assert nugget.decodebench_recorder.task_summaries()["t"]["decoding"] == [
        {"do_sample": True, "temperature": 0.7, "top_k": 50, "top_p": None}
    ]


@pytest.mark.model
def test_bad_settings_of_any_request_stop_the_run_before_the_first_generation(tiny_checkpoint):
    from decodebench.models.baseline import Baseline

    model = Baseline.create({"pretrained": str(tiny_checkpoint), "device": "cpu"})
    good = fake_requests(["one", "two"])
    bad = fake_requests(["three"], temperature=math.nan)
    for request in bad:
        request.task_name = "later_task"
    with pytest.raises(GenerationSettingsError, match="task later_task generation_kwargs: temperature=nan"):
        model.generate_until(good + bad)
    assert model.decodebench_recorder.windows == []  # nothing of the good task ran first


def test_a_pretrained_path_that_does_not_exist_is_named_before_anything_loads():
    from decodebench.models.baseline import Baseline

    with pytest.raises(FileNotFoundError, match=r"pretrained='\./checkpoints/mine': no such path\. Allowed: "):
        Baseline.create({"pretrained": "./checkpoints/mine"})


def test_gen_kwargs_from_the_command_line_are_checked_before_the_model_loads(tmp_path):
    out = tmp_path / "out"
    proc = run_lm_eval(
        *("--model", "baseline", "--model_args", "pretrained=./no/such/model", "--tasks", "squad_mini"),
        *("--gen_kwargs", "do_sample=True,temperature=0", "--limit", "1", "--output_path", str(out)),
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    # the settings are refused first: the model (a missing path here) is never reached
    assert "--gen_kwargs: do_sample=true with temperature=0 samples nothing" in proc.stderr, explain(proc)
    assert "no such path" not in proc.stderr
    assert results_files(out) == []


@pytest.mark.model
def test_weights_that_are_not_finite_or_cannot_be_read_are_refused_at_load(tiny_checkpoint, tmp_path):
    """NaN weights gave rc 0 and empty generations recorded as a normal run; a bad header, a bare SafetensorError."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from decodebench.models.baseline import Baseline

    nan = tmp_path / "nan"
    shutil.copytree(tiny_checkpoint, nan)
    tensors = load_file(str(nan / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("mlp.up_proj.weight"))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(nan / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"1 weight tensor\(s\) hold NaN or infinite values \({name}\)"):
        Baseline.create({"pretrained": str(nan), "device": "cpu"})
    lowest = next(k for k in tensors if k.endswith("mlp.down_proj.weight"))
    tensors[lowest][1, 2] = -float("inf")  # the other end of a tensor's range
    save_file(tensors, str(nan / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"2 weight tensor\(s\) hold NaN or infinite values"):
        Baseline.create({"pretrained": str(nan), "device": "cpu"})
    header = tmp_path / "header"
    shutil.copytree(tiny_checkpoint, header)
    weights = header / "model.safetensors"
    weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])
    with pytest.raises(ValueError, match=rf"pretrained={header}: a weights file cannot be read"):
        Baseline.create({"pretrained": str(header), "device": "cpu"})
    assert torch.isfinite(load_file(str(tiny_checkpoint / "model.safetensors"))[name]).all()


@pytest.mark.model
def test_a_warm_up_decodes_each_tasks_first_requests_untimed_and_keeps_them_out_of_every_figure(tiny_checkpoint):
    from decodebench.models.baseline import Baseline

    prompts = ["Question: where is the bridge?\nAnswer:", "The river Alder", "A third prompt"]
    plain = Baseline.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "batch_size": 2})
    warmed = Baseline.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "batch_size": 2, "warmup": "2"})
    decoded = []
    decode = warmed.method.hf_decode
    warmed.method.hf_decode = lambda lm, input_ids, *args, **kwargs: (
        decoded.append(input_ids.shape[0]) or decode(lm, input_ids, *args, **kwargs)
    )
    requests = fake_requests(prompts, max_gen_toks=4)
    later = fake_requests(prompts[:1], max_gen_toks=4)
    for request in later:
        request.task_name = "later_task"
    assert warmed.generate_until(requests + later) == plain.generate_until(requests + later)
    # the first two requests of each task's first batch once untimed (one for the task that has one), then the
    # timed batches
    assert decoded == [2, 2, 1, 1, 1]
    summaries = warmed.decodebench_recorder.task_summaries()
    assert summaries["t"]["requests"] == 3 and summaries["later_task"]["requests"] == 1
    assert len(warmed.decodebench_recorder.windows) == len(plain.decodebench_recorder.windows) == 3
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ValueError, match="untimed requests before each task's timed ones, a whole number >= 0"):
            Baseline.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "warmup": bad})
