"""The paper's nugget compressor: training (scorer + LoRA + soft token, straight-through), checkpoints
that are refused when they cannot be trusted, and memory that stays linear in the document."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest
import torch

from decodebench.data.corpus import PROSE_CORPUS
from decodebench.models.nugget.checkpoint import FORMAT, CheckpointError, read_checkpoint
from decodebench.models.nugget.training import TrainingSettings, shingles, split_corpus, train, training_device
from decodebench.models.nugget.training_settings import AUTHORS_RECIPE

pytestmark = pytest.mark.model

# tiny-model settings: a short run that still shows learning (the tiny model has 2 layers)
SETTINGS = TrainingSettings(
    ratio=4, steps=30, context=64, continuation=16, lr=3e-3, layer=1, eval_every=10, save_every=10, held_out_windows=8
)


class Interrupt(Exception):
    pass


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Python's reference documentation as a .jsonl corpus (the default corpus needs Debian's dictd packages)."""
    from decodebench.data.corpus import reference_corpus

    path = tmp_path_factory.mktemp("corpus") / "pydoc.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in reference_corpus()))
    return str(path)


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, corpus, tmp_path_factory):
    """A 30-step run interrupted after step 20's evaluation, then resumed by the same command."""
    out = tmp_path_factory.mktemp("nugget") / "tiny.safetensors"
    messages = []

    def interrupt_at_20(message):
        messages.append(message)
        if message.startswith("step 20:"):
            raise Interrupt

    with pytest.raises(Interrupt):
        train(str(tiny_checkpoint), out, SETTINGS, corpus=corpus, log=interrupt_at_20, progress=False)
    assert not out.exists(), "an interrupted run must not leave a checkpoint that looks complete"
    resumed = []
    train(str(tiny_checkpoint), out, SETTINGS, corpus=corpus, log=resumed.append, progress=False)
    return out, messages, resumed


def test_training_lowers_the_held_out_loss_and_resumes_where_it_stopped(trained):
    out, first, resumed = trained
    assert any("dropped for sharing text with the evaluation samples" in m for m in first)
    assert any("resuming from step 10" in m for m in resumed)  # the last save before the interruption
    checkpoint = read_checkpoint(out)
    held_out = checkpoint.training["held_out"]
    assert [step for step, _ in held_out] == [0, 10, 20, 30]
    assert held_out[-1][1] < held_out[0][1], held_out
    log = json.loads(out.with_name(out.name + ".log.json").read_text())
    assert len(log["losses"]) == SETTINGS.steps  # the resumed run did the missing steps, no more
    assert checkpoint.training["settings"]["ratio"] == 4 and checkpoint.has_adapters


def test_a_checkpoint_round_trips_into_nugget_and_runs_with_its_adapters(trained, tiny_checkpoint):
    from decodebench.models.nugget import Nugget

    out, _, _ = trained
    saved = read_checkpoint(out)
    model = Nugget.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": str(out), "ratio": 4})
    assert model.method.description.startswith("the paper's nugget: trained scorer + LoRA encoder/decoder")
    adapters = model.method.selector.adapters
    for key, value in adapters.state_dict().items():
        torch.testing.assert_close(value, saved.tensors[key].to(value.dtype))  # saved in bfloat16
    document = "The river Alder flows past the old bridge. It reopened on Monday after a flood. " * 3
    request = SimpleNamespace(
        task_name="t", doc_id=0, idx=0, args=(f"{document}\n\nWhat reopened?", {"until": [], "max_gen_toks": 4})
    )
    (text,) = model.generate_until([request])
    assert isinstance(text, str)
    summary = model.decodebench_recorder.task_summaries()["t"]["method"]
    assert summary["compressed_requests"] == 1 and summary["selector"] == model.method.description
    other = SimpleNamespace(
        task_name="t", doc_id=1, idx=0, args=(f"{document * 2}\n\nWhen?", {"until": [], "max_gen_toks": 4})
    )
    args = {"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": str(out), "ratio": 4}
    together = Nugget.create({**args, "batch_size": 2}).generate_until([request, other])
    assert together == Nugget.create({**args, "batch_size": 1}).generate_until([request, other])
    ablation = Nugget.create(
        {"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": str(out), "ratio": 4, "adapters": False}
    )
    assert ablation.method.description.startswith("trained scorer only, frozen model")
    assert ablation.method.selector.adapters is None


def write_variant(source, target, change):
    """A copy of a checkpoint with its tensors or metadata changed by ``change(tensors, metadata)``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    change(tensors, metadata)
    save_file(tensors, str(target), metadata=metadata)
    return target


def nan_scorer(tensors, metadata):
    tensors["scorer.net.0.weight"][0, 0] = float("nan")


def other_model(tensors, metadata):
    identity = json.loads(metadata["model"])
    identity["embedding_probe"] = [v + 1.0 for v in identity["embedding_probe"]]
    metadata["model"] = json.dumps(identity)


def other_rank(tensors, metadata):
    adapters = json.loads(metadata["adapters"])
    metadata["adapters"] = json.dumps({**adapters, "rank": adapters["rank"] * 2})


def huge_rank(tensors, metadata):  # built before its shapes were checked, it asked for terabytes
    adapters = json.loads(metadata["adapters"])
    metadata["adapters"] = json.dumps({**adapters, "rank": 10**9})


def nan_alpha(tensors, metadata):
    adapters = json.loads(metadata["adapters"])
    metadata["adapters"] = json.dumps({**adapters, "alpha": float("nan")})


def unknown_targets(tensors, metadata):
    adapters = json.loads(metadata["adapters"])
    metadata["adapters"] = json.dumps({**adapters, "targets": ["q_proj", "qkv_proj"]})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (nan_scorer, "non-finite values (NaN or inf) in scorer.net.0.weight"),
        (lambda t, m: m.update(format="decodebench-nugget-selector/1"), "is not a decodebench nugget checkpoint"),
        (lambda t, m: m.update(model="{not json"), "malformed metadata"),
        (lambda t, m: t.pop("soft_token"), "adapter settings or the soft token missing"),
        (lambda t, m: t.pop("encoder.model.layers.0.self_attn.q_proj.lora_A.weight"), "adapter tensors do not match"),
        (other_model, "was trained for another model"),
        (other_rank, "its metadata says rank 64, but its adapter tensors include"),
        (huge_rank, "its metadata says rank 1000000000, but its adapter tensors include"),
        (nan_alpha, "adapter alpha nan: expected a finite number"),
        (unknown_targets, "its adapters wrap ['qkv_proj'], which this model does not have"),
        (lambda t, m: m.update(scorer='{"feature_norm": "yes"}'), "scorer feature_norm 'yes': expected true or false"),
        (lambda t, m: m.update(scorer="[1]"), "malformed metadata"),
    ],
)
def test_a_checkpoint_that_cannot_be_trusted_is_refused_before_generation(
    trained, tiny_checkpoint, tmp_path, change, message
):
    from decodebench.models.nugget import Nugget

    out, _, _ = trained
    variant = write_variant(out, tmp_path / "variant.safetensors", change)
    with pytest.raises(CheckpointError) as error:
        Nugget.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": str(variant), "ratio": 4})
    assert message in str(error.value)
    if change is other_model:  # two models of the same name and sizes are still told apart in the message
        trained_for = str(error.value).split("trained for another model (")[1].split("); the model loaded now is ")
        assert trained_for[0] != trained_for[1].split(". Train one")[0]


def test_training_writes_a_manifest_whose_sha256_the_loader_checks(trained, tiny_checkpoint, tmp_path):
    import shutil

    from decodebench.data.paths import sha256_file
    from decodebench.models.nugget import Nugget
    from decodebench.models.nugget.shipped import manifest_path, verify

    out, _, _ = trained
    manifest = json.loads(manifest_path(out).read_text())
    assert manifest["sha256"] == sha256_file(out) and manifest["bytes"] == out.stat().st_size
    assert manifest["steps"] == SETTINGS.steps and manifest["seed"] == SETTINGS.seed
    assert manifest["device"] == str(training_device())  # the CPU here, the GPU where torch sees one
    assert manifest["final_held_out_loss"] == read_checkpoint(out).training["held_out"][-1][1]
    split = manifest["corpus_split"]
    assert (
        split["trained_on"] + split["held_out"] + split["dropped_for_sharing_text_with_evaluation_samples"]
        == (split["documents"])
    )
    assert verify(out) == manifest
    args = {"pretrained": str(tiny_checkpoint), "device": "cpu", "ratio": 4}
    model = Nugget.create({**args, "selector": str(out)})
    assert model.method.selector.record()["checkpoint_sha256"] == manifest["sha256"]

    # a copy cut short, or a different checkpoint under the manifest's name, is refused before the model loads
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(out.read_bytes()[: out.stat().st_size // 2])
    shutil.copy(manifest_path(out), manifest_path(cut))
    swapped = write_variant(out, tmp_path / "swapped.safetensors", lambda t, m: m.update(ratio="5.0"))
    shutil.copy(manifest_path(out), manifest_path(swapped))
    for path in (cut, swapped):
        with pytest.raises(CheckpointError, match="is not the file its manifest names: sha256"):
            Nugget.create({**args, "selector": str(path), "pretrained": "/nonexistent/never/loaded"})


def test_the_shipped_checkpoints_match_their_manifests_and_refuse_other_models(tiny_checkpoint):
    from decodebench.models.nugget import Nugget
    from decodebench.models.nugget.shipped import WEIGHTS_DIR, shipped_checkpoint, verify

    for ratio in (5, 10):
        path = shipped_checkpoint(ratio)
        manifest = verify(path, required=True)
        checkpoint = read_checkpoint(path)
        assert checkpoint.ratio == ratio and checkpoint.has_adapters and path.stat().st_size <= 16 * 2**20
        assert {t.dtype for t in checkpoint.tensors.values()} == {torch.bfloat16}
        # train-nugget's defaults are the shipped runs' settings and corpus: `--ratio R` alone repeats them (a
        # setting added since, which their manifests lack, defaults to what they did)
        defaults = asdict(TrainingSettings(ratio=float(ratio)))
        assert manifest["settings"] == {key: defaults[key] for key in manifest["settings"]}
        added = set(defaults) - set(manifest["settings"])
        assert added == {"windows", "lora_targets", "lora_dropout", "feature_norm", "weight_decay", "lora_lr"} | {
            "accumulate"
        }
        assert checkpoint.adapters["targets"] == list(TrainingSettings().adapter_targets())
        assert not checkpoint.feature_norm and TrainingSettings().accumulate == 1
        assert manifest["corpus"] == PROSE_CORPUS and manifest["steps"] == TrainingSettings().steps
        assert manifest["command"].startswith("decodebench train-nugget") and len(manifest["revision"]) >= 40
    assert sorted(p.name for p in WEIGHTS_DIR.glob("*.safetensors*")) == [
        "embedded-answer-spans.safetensors",
        "embedded-r10.safetensors.xz",
        "embedded-r5.safetensors.xz",
    ]
    paper = {"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": "trained"}
    with pytest.raises(CheckpointError, match=r"no shipped checkpoint at ratio=7 \(shipped: ratio 5, 10\)"):
        Nugget.create({**paper, "ratio": 7})
    with pytest.raises(CheckpointError, match=r"embedded-r10\.safetensors was trained for another model"):
        Nugget.create({**paper, "ratio": 10})
    # the default, the answer-span scorer: one file for every ratio, for the embedded model only
    with pytest.raises(CheckpointError, match=r"embedded-answer-spans\.safetensors was trained for another model"):
        Nugget.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "ratio": 7})


def test_a_shipped_checkpoint_is_unpacked_once_and_a_damaged_copy_made_again(tmp_path, monkeypatch):
    """The paper's compressors ship xz-compressed and are unpacked into the cache: a copy cut or altered there is made
    again from the packed file (the manifest's sha256 decides), and a packed file that cannot be read is named."""
    import shutil

    from decodebench.models.nugget import shipped

    monkeypatch.setenv("DECODEBENCH_HOME", str(tmp_path / "home"))
    path = shipped.shipped_checkpoint(5)
    expected = shipped.verify(path, required=True)["sha256"]
    made = path.stat().st_mtime_ns
    assert shipped.shipped_checkpoint(5) == path and path.stat().st_mtime_ns == made  # once
    with open(path, "r+b") as copy:
        copy.truncate(1000)
    assert shipped.verify(shipped.shipped_checkpoint(5), required=True)["sha256"] == expected
    weights = tmp_path / "weights"
    shutil.copytree(shipped.WEIGHTS_DIR, weights)
    (weights / "embedded-r10.safetensors.xz").write_bytes(b"not xz")
    monkeypatch.setattr(shipped, "WEIGHTS_DIR", weights)
    with pytest.raises(CheckpointError, match=r"embedded-r10\.safetensors\.xz: cannot be unpacked .*reinstall"):
        shipped.shipped_checkpoint(10)


def test_a_checkpoint_run_at_another_ratio_says_so(trained, tiny_checkpoint, caplog):
    from decodebench.models.nugget import Nugget

    out, _, _ = trained
    with caplog.at_level("WARNING"):
        Nugget.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": str(out), "ratio": 3})
    assert "was trained at ratio 4 and runs at ratio=3" in caplog.text


def test_a_cut_resume_file_is_named(tiny_checkpoint, corpus, tmp_path):
    target = tmp_path / "again.safetensors"
    resume = target.with_name(target.name + ".resume.pt")
    resume.write_bytes(b"PK\x03\x04" + b"\x00" * 100)  # the start of a zip, then nothing
    with pytest.raises(ValueError, match=rf"the resume file {resume} cannot be read"):
        train(str(tiny_checkpoint), target, SETTINGS, corpus=corpus, log=lambda message: None, progress=False)


def test_windows_in_the_chat_template_with_autoencoding_are_laid_out_as_the_tasks_prompt(tiny_checkpoint):
    """--chat: the compressed part is a user turn's opening and text up to its blank line, as --model nugget cuts
    squad_mini's prompts; the target is the assistant's reply (the part itself, or what follows it)."""
    import random

    from transformers import AutoTokenizer

    from decodebench.models.nugget.compressor import NuggetAdapters, NuggetScorer
    from decodebench.models.nugget.training import AUTOENCODE, CONTINUE, Windows, compression_loss

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    settings = TrainingSettings(ratio=4, context=64, continuation=16, autoencode=0.5, chat=True)
    entries = [f"Entry {i}: the tide pools at cove {i} hold barnacles and anemones." for i in range(80)]
    windows = Windows(tokenizer, entries, settings)
    assert all(len(d) >= settings.context + settings.continuation for d in windows.documents[:-1])  # entries joined
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "D\n\nQ"}], tokenize=False, add_generation_prompt=True
    )
    opening, closing = chat.split("D\n\nQ")
    kinds = set()
    rng = random.Random(0)
    for _ in range(12):
        window = windows.sample(rng)
        text = tokenizer.decode(window.compressed)
        assert text.startswith(opening) and text.endswith("\n\n")
        instruction = tokenizer.decode(window.prompt)
        assert instruction in (AUTOENCODE + closing, CONTINUE + closing)
        assert window.target[-1] == tokenizer.eos_token_id
        start, separator = (len(tokenizer(t, add_special_tokens=False).input_ids) for t in (opening, "\n\n"))
        if instruction.startswith(AUTOENCODE):
            assert window.target[:-1] == window.compressed[start:-separator]
        kinds.add(instruction.startswith(AUTOENCODE))
    assert kinds == {True, False}
    model = __import__("transformers").AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    scorer, adapters = NuggetScorer(model.config.hidden_size, layer=1), NuggetAdapters(model, rank=4)
    loss = compression_loss(model, scorer, adapters, windows.sample(rng), settings.ratio)
    loss.backward()
    assert torch.isfinite(loss) and adapters.soft_token.grad is not None


AUTHORS = replace(
    SETTINGS,
    **{**AUTHORS_RECIPE, "accumulate": 2, "lora_lr": 1e-3},
    steps=4,
    eval_every=2,
    save_every=2,
    held_out_windows=4,
)


def test_the_authors_windows_hold_one_document_each_bos_kept_whole_and_a_fake_eos(tiny_checkpoint):
    """--recipe authors: a window is one document (BOS, its opening, a "." unless it ends in punctuation; its last
    tokens the target), never two run together; a document shorter than 4 x ratio tokens is left out."""
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodebench.models.nugget.compressor import NuggetScorer, encode_nuggets
    from decodebench.models.nugget.training import DocumentWindows, training_windows

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    documents = [
        "The tide pools at the north cove hold barnacles, anemones and small crabs that hide under the weed " * 3,
        "A lighthouse keeper's log records the weather each morning, the ships passing, and the lamp's oil.",
        "Too short.",
    ]
    settings = replace(AUTHORS, context=48, continuation=16)
    windows = training_windows(tokenizer, documents, settings)
    assert isinstance(windows, DocumentWindows) and len(windows.documents) == 2
    tokenize = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    stop, appended = tokenize(".")[-1], []
    for text, ids in zip(documents, windows.documents, strict=False):
        assert ids == tokenize(text)[: settings.context + settings.continuation]
        window = windows.window(ids)
        assert window.compressed[0] == tokenizer.bos_token_id and window.kept_whole == 1 and window.prompt == []
        target = 16 if len(ids) > 32 else len(ids) // 2
        assert window.target == ids[-target:]
        cut = len(ids) - target
        ends_a_sentence = ids[cut - 1] in windows.punctuation
        assert window.compressed[1:] == ids[:cut] + ([] if ends_a_sentence else [stop])
        appended.append(not ends_a_sentence)
    assert any(appended)
    assert {tuple(windows.sample(random.Random(seed)).target) for seed in range(20)} == {
        tuple(windows.window(ids).target) for ids in windows.documents
    }
    # BOS is kept as the prompt's opening is at test time, whatever its score
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    window = windows.window(windows.documents[0])
    scores = torch.arange(len(window.compressed), dtype=torch.float32)  # BOS scores lowest
    nuggets = encode_nuggets(model, torch.tensor([window.compressed]), scores, 4, False, window.kept_whole)
    assert nuggets.indices[0, 0] == 0 and nuggets.indices.shape[1] == 1 + math.ceil((len(window.compressed) - 1) / 4)
    # the authors' scorer features: layer 1 through the model's final RMSNorm
    scorer = NuggetScorer(model.config.hidden_size, layer=1, feature_norm=True)
    document = torch.tensor([window.compressed])
    hidden = model(document, output_hidden_states=True).hidden_states[1][0]
    torch.testing.assert_close(scorer.score(model, document), scorer(model.model.norm(hidden)))
    assert not torch.allclose(scorer.score(model, document), scorer(hidden))


@pytest.mark.parametrize("recipe", ["joined chat windows", "the authors' document windows"])
def test_windows_stepped_together_give_each_window_its_own_loss_and_gradients(tiny_checkpoint, recipe):
    """A padded batch of windows of different lengths (compressed parts, kept openings, prompts, targets) gives every
    window the loss it has alone, and the batch's summed loss the summed gradients of the scorer (through the
    straight-through term), both adapters and the soft token: padding reaches no real token."""
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decodebench.models.nugget.compressor import NuggetAdapters, NuggetScorer
    from decodebench.models.nugget.training import compression_loss, compression_losses, training_windows

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    if recipe == "joined chat windows":
        settings = TrainingSettings(ratio=4, context=64, continuation=16, autoencode=0.5, chat=True)
    else:
        settings = replace(AUTHORS, context=48, continuation=16)
    entries = [
        f"Entry {i}: the tide pools at cove {i} hold barnacles, anemones and {i % 7} crabs. " * (1 + i % 4)
        for i in range(40)
    ]
    rng = random.Random(3)
    windows = [training_windows(tokenizer, entries, settings).sample(rng) for _ in range(5)]
    assert len({len(w.compressed) for w in windows}) > 1 and len({len(w.prompt + w.target) for w in windows}) > 1
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    torch.manual_seed(0)
    scorer = NuggetScorer(model.config.hidden_size, layer=1, feature_norm=settings.feature_norm)
    adapters = NuggetAdapters(model, rank=4, targets=settings.adapter_targets())
    with torch.no_grad():  # adapters that start at zero would hide a gradient that never reaches them
        for parameter in [*adapters.parameters("encoder"), *adapters.parameters("decoder")]:
            parameter.normal_(std=0.05)
    trained = [
        *scorer.parameters(),
        adapters.soft_token,
        *adapters.parameters("encoder"),
        *adapters.parameters("decoder"),
    ]

    def gradients(loss):
        for parameter in trained:
            parameter.grad = None
        loss.backward()
        # the encoder's last query projection reaches no kept key or value: no gradient, alone or together
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in trained]

    alone = [compression_loss(model, scorer, adapters, w, settings.ratio, autocast=False) for w in windows]
    together = compression_losses(model, scorer, adapters, windows, settings.ratio, autocast=False)
    torch.testing.assert_close(together, torch.stack(alone), rtol=1e-5, atol=1e-5)
    expected, got = gradients(torch.stack(alone).sum()), gradients(together.sum())
    assert all(g.abs().sum() > 0 for g in got[:5])  # the scorer learns through eq. 18's term, and the soft token
    decoder = len(adapters.parameters("decoder"))
    assert all(g.abs().sum() > 0 for g in got[-decoder:])  # as does every decoder adapter tensor
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-6)


def test_the_authors_recipe_trains_accumulated_batches_with_dropout_and_its_checkpoint_decodes(
    tiny_checkpoint, corpus, tmp_path, monkeypatch
):
    from decodebench.models.nugget import Nugget, training
    from decodebench.models.nugget.compressor import NuggetAdapters

    passes = []  # (training mode, windows) of each forward pass
    real_losses = training.compression_losses

    def counted(model, scorer, adapters, windows, *args):
        passes.append((model.training, len(windows)))
        return real_losses(model, scorer, adapters, windows, *args)

    monkeypatch.setattr(training, "compression_losses", counted)
    out = tmp_path / "authors.safetensors"
    train(str(tiny_checkpoint), out, AUTHORS, corpus=corpus, log=lambda message: None, progress=False, micro_batch=3)
    held_out = AUTHORS.held_out_windows * 3  # before training, at step 2 and at step 4
    # dropout on (training mode) for the steps' windows, 3 to a pass: each step's 2 in one
    assert [count for mode, count in passes if mode] == [AUTHORS.accumulate] * AUTHORS.steps
    assert sum(count for mode, count in passes if not mode) == held_out  # held-out losses without dropout
    assert {count for mode, count in passes if not mode} == {3, 1}  # 4 held-out windows: 3, then 1
    saved = read_checkpoint(out)
    assert saved.adapters["targets"] == ["q_proj", "v_proj", "o_proj"] and saved.feature_norm
    assert saved.training["settings"]["windows"] == "document" and saved.training["settings"]["weight_decay"] == 0.1
    assert saved.scorer().feature_norm
    args = {"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": str(out), "ratio": 4}
    model = Nugget.create(args)
    assert isinstance(model.method.selector.adapters, NuggetAdapters)
    assert not model.method.selector.adapters.model.training  # decoding: no dropout
    request = SimpleNamespace(
        task_name="t",
        doc_id=0,
        idx=0,
        args=("The old bridge reopened on Monday.\n\nWhat reopened?", {"until": [], "max_gen_toks": 3}),
    )
    assert model.generate_until([request]) == Nugget.create(args).generate_until([request])  # deterministic


def test_train_nugget_takes_the_authors_recipe_and_names_a_bad_setting_before_loading_anything(tmp_path):
    from conftest import decodebench_in_process

    helped = decodebench_in_process("train-nugget", "--help", cwd=tmp_path)
    assert "--recipe {shipped,authors,answer-spans}" in helped.stdout
    assert "--lora-targets q_proj,v_proj,o_proj" in helped.stdout and "--accumulate 16" in helped.stdout
    bad = decodebench_in_process(
        "train-nugget", "--recipe", "authors", "--lora-dropout", "1.5", "--pretrained", "/nonexistent", cwd=tmp_path
    )
    assert bad.returncode == 2 and "lora_dropout must be in [0, 1), got 1.5" in bad.stderr
    bad = decodebench_in_process("train-nugget", "--windows", "pages", "--pretrained", "/nonexistent", cwd=tmp_path)
    assert bad.returncode == 2 and "windows must be one of joined, document, got 'pages'" in bad.stderr
    bad = decodebench_in_process("train-nugget", "--device", "tpu", "--pretrained", "/nonexistent", cwd=tmp_path)
    assert bad.returncode == 2 and "device='tpu': allowed: cpu, cuda, cuda:N" in bad.stderr
    bad = decodebench_in_process("train-nugget", "--micro-batch", "0", "--pretrained", "/nonexistent", cwd=tmp_path)
    assert bad.returncode == 2 and "micro_batch (windows per forward pass) must be an integer >= 1, got 0" in bad.stderr
    if not torch.cuda.is_available():  # a GPU asked for where there is none: said before the model loads
        bad = decodebench_in_process("train-nugget", "--device", "cuda", "--pretrained", "/nonexistent", cwd=tmp_path)
        assert bad.returncode == 2 and "sees no CUDA device here; allowed: cpu" in bad.stderr


def test_garbage_or_pickled_files_are_refused_without_advice_to_load_them_unsafely(tmp_path):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x80\x04not a checkpoint at all" * 50)
    pickled = tmp_path / "old-selector.pt"
    torch.save({"format": "decodebench-nugget-selector/1", "state_dict": {}}, pickled)
    for path in (garbage, pickled):
        with pytest.raises(CheckpointError) as error:
            read_checkpoint(path)
        assert "cannot be read as a safetensors file" in str(error.value)
        assert "weights_only" not in str(error.value)
    with pytest.raises(CheckpointError, match="neither a built-in selector nor an existing checkpoint"):
        read_checkpoint(tmp_path / "missing.safetensors")
    assert FORMAT == "decodebench-nugget/2"


def test_the_corpus_drops_documents_that_share_text_with_the_evaluation_samples():
    from decodebench.data.paths import TASKS_DIR
    from decodebench.data.taskdata import read_records

    squad = read_records(TASKS_DIR / "squad" / "squad_mini.jsonl")[0]["context"]
    clean = "A wholly unrelated paragraph about tide pools, barnacles and the sea anemones that live there. " * 3
    training, held, dropped = split_corpus([clean, f"Prefix words here. {squad[:400]}", clean + " more"])
    assert dropped == 1 and len(training) + len(held) == 2
    # the check reads words, not characters: the lowercased, PTB-tokenized copy is caught too
    ptb = " ".join(squad[:400].lower().replace(",", " ,").replace(".", " .").split())
    assert shingles(ptb) & shingles(squad)


def test_an_8k_token_document_stays_within_a_memory_cap(tiny_checkpoint):
    """All layers' attention maps over this document would take 2 layers x 4 heads x n^2 x 4 bytes
    (over 2 GiB); the selectors never hold more than one layer's weights for the question's rows, nor the
    vocabulary's logits for more than a chunk of positions."""
    from decodebench.models.nugget import Nugget

    document = "The river Alder flows past the old bridge, which reopened on Monday after a flood. " * 460
    prompt = f"{document}\n\nWhat reopened?"
    # question-overlap computes salience's surprisal (SalienceSelector.surprisal, the vocabulary's logits in chunks)
    # and scores on top in one pass over the tokens: salience itself adds nothing to measure here but 6 s of CPU
    for selector in ("query-attention", "question-overlap", "delimiter"):
        model = Nugget.create(
            {"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": selector, "max_length": 16384}
        )
        request = SimpleNamespace(task_name="t", doc_id=0, idx=0, args=(prompt, {"until": [], "max_gen_toks": 2}))
        model.generate_until([request])
        summary = model.decodebench_recorder.task_summaries()["t"]
        n = summary["method"]["document_tokens"]
        assert n >= 8000
        all_layer_maps = 2 * 4 * n * n * 4
        assert summary["memory_source"] == "cpu-resident-growth"
        assert summary["peak_memory_bytes"] < 512 * 2**20 < all_layer_maps / 4, (selector, summary["peak_memory_bytes"])


# -- the answer-span scorer (ours, issue 35) -----------------------------------------------------------------------
def test_answer_worthy_spans_are_the_marked_terms_names_and_numbers_laid_out_as_a_document(tiny_checkpoint):
    from transformers import AutoTokenizer

    from decodebench.models.nugget.span_training import SEPARATOR, answer_worthy_spans, span_window

    text = "The IBM PC ran MS-DOS. In 1981 Don Estridge led the team; see the operating system."
    terms = [(text.index("operating system"), text.index("operating system") + len("operating system"))]
    spans = answer_worthy_spans(text, terms)
    # "The" and "In" open sentences; "IBM" (two capitals), "PC", "MS-DOS", "1981" and the names are kept
    assert [text[a:b] for a, b in spans] == ["IBM", "PC", "MS-DOS", "1981", "Don", "Estridge", "operating system"]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    window = span_window(tokenizer, "<|im_start|>user\n", text, spans, context=256)
    document = window.ids[window.document :]
    assert tokenizer.decode(window.ids[: window.document]) == "<|im_start|>user\n"
    assert tokenizer.decode(document).endswith(SEPARATOR) and window.targets[-1] == 0.0
    marked = "".join(tokenizer.decode([t]) for t, y in zip(document, window.targets, strict=True) if y)
    assert "Estridge" in marked and "operating system" in marked and "team" not in marked and "The" not in marked
    short = span_window(tokenizer, "", text, spans, context=5)  # the entry's first 5 tokens, then the separator
    assert len(short.ids) == 5 + len(tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"])


def test_the_answer_span_scorer_learns_resumes_and_runs_as_a_selector_for_every_ratio(
    tiny_checkpoint, corpus, tmp_path
):
    from decodebench.models.nugget import Nugget
    from decodebench.models.nugget.compressor import LayerScores, encode_nuggets, layer_hidden_states, read_layer
    from decodebench.models.nugget.selectors import AnswerSpanSelector
    from decodebench.models.nugget.span_training import OBJECTIVE, USED_SETTINGS, train_span_scorer
    from decodebench.models.nugget.training_settings import ANSWER_SPANS_RECIPE

    settings = replace(
        TrainingSettings(**ANSWER_SPANS_RECIPE),
        steps=20,
        accumulate=4,
        context=64,
        layer=1,
        eval_every=10,
        save_every=5,
        held_out_windows=8,
    )
    out = tmp_path / "spans.safetensors"

    def interrupt_at_10(message):
        if message.startswith("step 10:"):
            raise Interrupt

    with pytest.raises(Interrupt):
        train_span_scorer(str(tiny_checkpoint), out, settings, corpus=corpus, log=interrupt_at_10, progress=False)
    assert not out.exists()
    resumed = []
    train_span_scorer(str(tiny_checkpoint), out, settings, corpus=corpus, log=resumed.append, progress=False)
    assert any("resuming from step 5" in m for m in resumed)  # the last save before the interruption
    checkpoint = read_checkpoint(out)
    held_out = checkpoint.training["held_out"]
    assert [step for step, _ in held_out] == [0, 10, 20] and held_out[-1][1] < held_out[0][1], held_out
    assert checkpoint.training["objective"] == OBJECTIVE and not checkpoint.has_adapters and checkpoint.feature_norm
    assert set(checkpoint.training["settings"]) == set(USED_SETTINGS)  # not the paper trainer's ratio or adapters
    # its resume file is kept: a setting it uses, changed, is refused by name; one it does not use changes nothing
    with pytest.raises(ValueError, match=r"other settings \{'lr': \(0\.001, 0\.002\)\}"):
        train_span_scorer(str(tiny_checkpoint), out, replace(settings, lr=0.002), corpus=corpus, progress=False)
    again = []
    train_span_scorer(str(tiny_checkpoint), out, replace(settings, ratio=7.0), corpus=corpus, log=again.append)
    assert any("resuming from step 20" in m for m in again)
    document = "The river Alder flows past Hudsonville. It reopened on Monday, 3 March 1958, after a flood. " * 3
    question = f"{document}\n\nWhat reopened?"
    request = SimpleNamespace(task_name="t", doc_id=0, idx=0, args=(question, {"until": [], "max_gen_toks": 4}))
    args = {"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": str(out)}
    for ratio in (4, 10):  # one scorer, any ratio
        model = Nugget.create({**args, "ratio": ratio})
        assert isinstance(model.method.selector, AnswerSpanSelector)
        assert model.method.description.startswith("answer-span scorer (ours, not the paper's method")
        (text,) = model.generate_until([request])
        (record,) = model.decodebench_recorder.records
        stats = record.method_stats
        assert isinstance(text, str) and stats["nuggets"] == -(-stats["document_tokens"] // ratio)
    # as every selector: the chat template's opening kept whole, the ratio applied to the document alone
    chat = model.tok_encode(model.apply_chat_template([{"role": "user", "content": question}]))
    row = model.method.compress(model, chat)
    opening, kept = row.stats["opening_tokens"], row.stats["nuggets"]
    assert model.tokenizer.decode(chat[:opening]).endswith("<|im_start|>user\n")
    assert model.tokenizer.decode(chat[opening : opening + row.stats["document_tokens"]]).startswith(document[:30])
    assert row.layers[0][0].shape[2] == opening + kept and kept == -(-row.stats["document_tokens"] // 10)
    # its scores come from the encoding pass (no pass of their own): the same layer's states, so the same nuggets
    ids = torch.tensor([chat[: opening + row.stats["document_tokens"]]])
    shared = model.method.selector.encoding_scores(model, ids, [])
    assert isinstance(shared, LayerScores) and shared.layer == 1
    with read_layer(model.model, 1) as captured:
        model.model(input_ids=ids)
    assert torch.equal(captured[0], layer_hidden_states(model.model, ids, 1))
    apart = encode_nuggets(model.model, ids, model.method.selector.scores(model, ids, []), 10, False, opening)
    together = encode_nuggets(model.model, ids, shared, 10, False, opening)
    assert torch.equal(apart.indices, together.indices)
    assert all(torch.equal(a.keys, b.keys) for a, b in zip(apart.cache.layers, together.cache.layers, strict=True))
    # the shipped one is the embedded model's: another model is refused by name before its first request
    with pytest.raises(CheckpointError, match=r"embedded-answer-spans\.safetensors was trained for another model"):
        Nugget.create({"pretrained": str(tiny_checkpoint), "device": "cpu", "selector": "answer-spans"})
