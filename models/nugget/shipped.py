"""The trained compressors that ship with decodebench, and the manifest that vouches for every checkpoint.

``models/nugget/weights/`` holds one ``decodebench train-nugget`` checkpoint per compression ratio for the
embedded model, each with a manifest beside it (``embedded-r10.json`` for ``embedded-r10.safetensors``): the
exact command that trained it, the corpus and its license, what was held out, the steps, seed and held-out
losses, the git revision of the code that trained it, and the file's sha256. ``selector=trained`` (the paper's
method) reads the shipped checkpoint of the run's ratio, ``selector=answer-spans`` (the default of ``--model
nugget``) the shipped span scorer ``embedded-answer-spans.safetensors``, one for every ratio; any checkpoint with a
manifest beside it is checked against the manifest's sha256 before anything loads, so a truncated or swapped file
is refused by name. The paper's compressors ship xz-compressed (10.5 MiB each, 7.4 packed: the tree travels to GPU
machines in at most 64 MiB) and are unpacked once into decodebench's cache, where the manifest's sha256 vouches for
the copy as it did for the file.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from decodebench.data.paths import sha256_file
from decodebench.models.nugget.checkpoint import CheckpointError

WEIGHTS_DIR = Path(__file__).parent / "weights"
SHIPPED_MODEL = "embedded"  # the model the shipped checkpoints were trained for


def manifest_path(checkpoint: str | Path) -> Path:
    return Path(checkpoint).with_suffix(".json")


PACKED = ".xz"  # how the paper's compressors ship


def shipped_checkpoint(ratio: float) -> Path:
    """The shipped checkpoint trained at ``ratio`` (unpacked into the cache), or a ``CheckpointError`` naming the
    ratios that ship."""
    packed = WEIGHTS_DIR / f"{SHIPPED_MODEL}-r{ratio:g}.safetensors{PACKED}"
    if not packed.is_file():
        names = (p.name.removesuffix(f".safetensors{PACKED}") for p in WEIGHTS_DIR.glob(f"{SHIPPED_MODEL}-r*{PACKED}"))
        shipped = sorted(float(name.rsplit("-r", 1)[1]) for name in names)
        raise CheckpointError(
            f"selector=trained: no shipped checkpoint at ratio={ratio:g} (shipped: ratio "
            f"{', '.join(f'{r:g}' for r in shipped) or 'none'}). Train one with `decodebench train-nugget --ratio "
            f"{ratio:g}` and pass selector=PATH, or use a built-in selector"
        )
    return unpacked(packed)


def unpacked(packed: Path) -> Path:
    """A shipped checkpoint decompressed once into decodebench's cache, its manifest beside it; made again when the
    copy there is not the file the manifest names (cut by an interrupted unpacking, or altered)."""
    from filelock import FileLock

    from decodebench.data.paths import home

    name = packed.name.removesuffix(PACKED)
    manifest = manifest_path(packed.with_name(name))
    try:
        expected = str(json.loads(manifest.read_text(encoding="utf-8"))["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest}: the shipped checkpoint's manifest is not readable ({exc!r})") from exc
    target = home() / "nugget" / "shipped" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target.is_file() and sha256_file(target) == expected):
            partial = target.with_name(target.name + ".partial")
            try:
                with lzma.open(packed) as source, open(partial, "wb") as sink:
                    shutil.copyfileobj(source, sink, 2**20)
            except (OSError, lzma.LZMAError, EOFError) as exc:
                raise CheckpointError(f"{packed}: cannot be unpacked ({exc}); reinstall decodebench") from exc
            os.replace(partial, target)
        shutil.copyfile(manifest, manifest_path(target))
    return target


def shipped_span_scorer() -> Path:
    """The answer-span scorer shipped for the embedded model (``selector=answer-spans``; one for every ratio)."""
    path = WEIGHTS_DIR / f"{SHIPPED_MODEL}-answer-spans.safetensors"
    if not path.is_file():
        raise CheckpointError(
            f"selector=answer-spans: {path} is missing (reinstall decodebench, or train one with `decodebench "
            "train-nugget --recipe answer-spans` and pass selector=PATH)"
        )
    return path


def verify(checkpoint: str | Path, required: bool = False) -> dict[str, Any] | None:
    """The manifest beside ``checkpoint`` once the file's sha256 matches it; None when there is no manifest
    (allowed unless ``required``). Raises ``CheckpointError`` for a file that is not the one its manifest names."""
    checkpoint, manifest_file = Path(checkpoint), manifest_path(checkpoint)
    if not manifest_file.is_file():
        if required:
            raise CheckpointError(f"{checkpoint}: its manifest {manifest_file.name} is missing")
        return None
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        expected = str(manifest["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest_file}: not a readable manifest ({exc!r})") from exc
    if not checkpoint.is_file():
        raise CheckpointError(f"{checkpoint} is missing (its manifest {manifest_file.name} is there)")
    actual = sha256_file(checkpoint)
    if actual != expected:
        raise CheckpointError(
            f"{checkpoint} is not the file its manifest names: sha256 {actual[:16]}... of {checkpoint.stat().st_size} "
            f"bytes, expected {expected[:16]}... of {manifest.get('bytes', '?')} bytes (a truncated or replaced file; "
            "reinstall decodebench, or retrain with the manifest's command)"
        )
    return manifest


def git_revision(folder: str | Path | None = None) -> str:
    """The commit the training code came from (with '+changes' when the checkout had uncommitted changes), or
    why it is unknown."""
    folder = str(folder or os.getcwd())
    try:
        revision = subprocess.run(
            ["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not trained from a git checkout)"
    return revision + ("+changes" if changed else "")


def write_manifest(
    checkpoint: str | Path,
    command: str,
    corpus_split: dict[str, Any],
    threads: int,
    revision: str | None = None,
    device: str = "cpu",
) -> Path:
    """Write the manifest beside ``checkpoint`` from the training record in its metadata (``revision``: the
    training code's commit, by default the current checkout's; ``device``: where it trained)."""
    from decodebench.measure.machine import describe, short_name
    from decodebench.models.nugget.checkpoint import read_checkpoint

    checkpoint = Path(checkpoint)
    read = read_checkpoint(checkpoint)
    training = read.training
    manifest = {
        "file": checkpoint.name,
        "sha256": sha256_file(checkpoint),
        "bytes": checkpoint.stat().st_size,
        "dtype": ", ".join(sorted({str(t.dtype).removeprefix("torch.") for t in read.tensors.values()})),
        "model": Path(read.identity.get("name") or "unnamed").name,
        "ratio": read.ratio,
        "command": command,
        "corpus": training.get("corpus"),
        "corpus_split": corpus_split,
        "settings": training.get("settings"),
        "steps": training.get("steps_done"),
        "seed": (training.get("settings") or {}).get("seed"),
        "held_out_loss": training.get("held_out"),
        "final_held_out_loss": (training.get("held_out") or [[None, None]])[-1][1],
        "training_seconds": training.get("seconds_this_run"),
        "revision": revision or git_revision(),
        "machine": f"{short_name(describe())}, torch threads {threads}",
        "device": device,
    }
    path = manifest_path(checkpoint)
    path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return path
