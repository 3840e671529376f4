"""A slim vLLM for a GPU machine without a network, in parts that each travel beside the tree (studies/gpu_vllm.py
runs it there: docs/benchmarks/gpu-vllm.md).

vLLM whole cannot go to such a machine: vllm 0.32.0 is a 311 MiB wheel that pins torch 2.13 and asks for about
2.6 GiB of packages the image lacks. Most of that is kernels this check does not need. The bundle holds:

- **vLLM's Python files and its stable-ABI extension** ``_C_stable_libtorch`` (its core CUDA ops, built against
  LibTorch's stable C ABI, so possibly loadable on the image's torch 2.11), from the release's own wheel: the
  flash-attention, MoE, DeepGEMM, FlashMLA and other kernel libraries, their headers and the ``vllm-rs`` binary are
  left out (``LEFT_OUT``), so attention runs on vLLM's Triton backend (``TRITON_ATTN``);
- **what vLLM's engine imports that the image lacks**: vLLM's requirements (markers evaluated for the image's
  CPython 3.12), walked as studies/gpu_wheelhouse.py walks decodebench's, except the ones in ``NOT_CARRIED`` (each
  with why: the image's own torch, kernel libraries only their backends import, the server's extras);
- **decodebench** (its wheel, built from this checkout, without its requirements: its vLLM plugins need vLLM, torch
  and numpy only);
- **the embedded model's config and tokenizer**, not its weights: the engine starts with ``load_format="dummy"``.

Every wheel is installed here into one ``site`` folder as pip would install it on the image (``pip install
--target``, for CPython 3.12 on Linux x86-64), the model files beside it, and the whole is one ``tar.xz`` (or,
with ``--compression gz``, a faster and larger ``tar.gz``) cut into
parts of at most ``--part-mib`` (default: 64 MiB less the tracked tree and 1 MiB). Each part carries the manifest
(the archive's sha256 and its pieces) and ``unpack.py``. On the machine, with the parts under one folder:

    python3 BUNDLE/part-1/unpack.py BUNDLE --extract ~/vllm-slim   # joins, checks the sha256, unpacks
    PYTHONPATH=~/vllm-slim/site python3 studies/gpu_vllm.py --model ~/vllm-slim/model --out OUT
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import gpu_wheelhouse as wheelhouse
from common import REPO

VLLM = "vllm==0.32.0"
# members of vLLM's wheel left out, and why (fnmatch patterns on the path inside the wheel)
LEFT_OUT = {
    "vllm/vllm_flash_attn/*.so": "flash-attention 2 and 3 (458 MiB): attention runs on vLLM's Triton backend",
    "vllm/_moe_C_stable_libtorch*.so": "mixture-of-experts kernels: the embedded model is dense",
    "vllm/third_party/*.so": "DeepGEMM's extension: FP8 GEMMs",
    "vllm/_flashmla*.so": "FlashMLA: multi-head latent attention models",
    "vllm/_flashkda*.so": "FlashKDA kernels",
    "vllm/_deepselect*.so": "DeepSeek sparse-attention selection",
    "vllm/_qutlass*.so": "quantized CUTLASS GEMMs",
    "vllm/vllm-rs": "the Rust front-end binary: the engine runs in Python here",
    "*.hpp": "C++ headers for kernels JIT-built on the machine",
    "*.h": "C++ headers",
    "*.cuh": "CUDA headers",
    "*.inl": "C++ headers",
    "*.cu": "CUDA sources",
}
# vLLM's requirements that are not carried, and why
NOT_CARRIED = {
    "torch": "the image's torch 2.11 (CUDA 13) runs instead of the pinned 2.13: the point of the check",
    "torchaudio": "the image's; audio models only",
    "torchvision": "the image's; vision models only",
    "torchcodec": "video decoding",
    "pynvvideocodec": "video decoding",
    "numba": "the image's numba 0.68 instead of the pinned 0.65 (vLLM's n-gram proposer compiles with it)",
    "flashinfer-python": "FlashInfer's kernels: imported only by its attention and sampling backends",
    "tilelang": "kernel language of a few quantized and sparse backends",
    "nvidia-cudnn-frontend": "cuDNN attention backends",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (FlashAttention 4, some MoE)",
    "quack-kernels": "CuTe DSL kernels",
    "tokenspeed-mla": "MLA kernels",
    "humming-kernels": "quantized kernels",
    "fastsafetensors": "a weights loader: dummy weights here",
    "instanttensor": "a weights loader: dummy weights here",
    "nvtx": "profiling ranges",
    "mcp": "the server's tool calling",
    "anthropic": "the server's Anthropic-compatible API",
    "model-hosting-container-standards": "SageMaker serving",
    "mistral-common": "Mistral tokenizers",
    "opencv-python-headless": "the image's 5.0 (image inputs only)",
    "watchfiles": "the server's reload",
}
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


def slim_vllm_wheel(wheel: Path, into: Path) -> tuple[Path, dict]:
    """vLLM's wheel without ``LEFT_OUT``'s members (its RECORD rewritten to match), and what was left out:
    {pattern: [MiB in the wheel, files]}."""
    left: dict[str, list] = {}
    slim = into / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as target:
        record_name = next(n for n in source.namelist() if n.endswith(".dist-info/RECORD"))
        kept = []
        for info in source.infolist():
            pattern = next((p for p in LEFT_OUT if fnmatch.fnmatch(info.filename, p)), None)
            if pattern:
                entry = left.setdefault(pattern, [0.0, 0])
                entry[0] += info.compress_size / wheelhouse.MIB
                entry[1] += 1
            elif info.filename != record_name:
                target.writestr(info, source.read(info))
                kept.append(info.filename)
        lines = [line for line in source.read(record_name).decode().splitlines() if line.split(",")[0] in kept]
        target.writestr(record_name, "\n".join([*lines, f"{record_name},,"]) + "\n")
    return slim, {pattern: [round(mib, 1), files] for pattern, (mib, files) in left.items()}


def fetch_vllm(into: Path, given: Path | None) -> Path:
    if given is not None:
        return Path(shutil.copy2(given, into))
    return next(iter(wheelhouse.fetch([VLLM], into).values()))


def requirement_wheels(vllm_wheel: Path, into: Path, log=print) -> list[Path]:
    """Every wheel vLLM's requirements need beyond the image and ``NOT_CARRIED``, their own requirements walked in
    turn, a level at a time."""
    wheels, seen = [], {"vllm", *NOT_CARRIED}
    level = [(vllm_wheel, ())]
    while level:
        wanted = {}
        for wheel, extras in level:
            for requirement in wheelhouse.requirements_of(wheel, extras):
                name = wheelhouse.canonical(requirement.name)
                if name not in seen and not wheelhouse.met_by_image(requirement):
                    seen.add(name)
                    wanted[name] = requirement
        fetched = wheelhouse.fetch([str(r).split(";")[0] for r in wanted.values()], into)
        level = []
        for name, requirement in wanted.items():
            log(f"  {fetched[name].name} ({fetched[name].stat().st_size / wheelhouse.MIB:.1f} MiB)")
            wheels.append(fetched[name])
            level.append((fetched[name], tuple(sorted(requirement.extras))))
    return wheels


def install_for_target(wheels: list[Path], site: Path) -> None:
    """The wheels installed into ``site`` as pip installs them for the image's interpreter."""
    platforms = [arg for platform in wheelhouse.PLATFORMS for arg in ("--platform", platform)]
    target = ["--python-version", "3.12", "--implementation", "cp", "--only-binary", ":all:", *platforms]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--no-index",
            "--target",
            str(site),
            *target,
            *map(str, wheels),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip install --target failed: {done.stderr.strip()[-2000:]}")


def model_folder(into: Path) -> Path:
    """The embedded model's config and tokenizer (no weights), from its unpacked checkpoint."""
    from decodebench.data.embedded import resolve_pretrained

    source = Path(resolve_pretrained("embedded")[0])
    into.mkdir(parents=True)
    for name in MODEL_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, into / name)
    return into


COMPRESSIONS = {"xz": {"preset": 6}, "gz": {"compresslevel": 6}}  # xz: 92 MiB in 3 parts, ~80 s; gz: ~20 s, larger


def archive(root: Path, out: Path, compression: str = "xz") -> Path:
    """``root``'s ``site`` and ``model`` folders and ``bundle.json`` as one compressed tar (deterministic order)."""
    with tarfile.open(out, f"w:{compression}", **COMPRESSIONS[compression]) as tar:
        for path in sorted(root.rglob("*")):
            if path.is_file() or path.is_symlink():
                tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return out


def build(
    out: Path,
    part_bytes: int,
    vllm_wheel: Path | None = None,
    own: Path | None = None,
    compression: str = "xz",
    log=print,
) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        wheels_dir, root = scratch / "wheels", scratch / "root"
        wheels_dir.mkdir()
        log(f"vLLM's wheel ({VLLM}):")
        full = fetch_vllm(wheels_dir, vllm_wheel)
        slim_dir = scratch / "slim"
        slim_dir.mkdir()
        slim, left_out = slim_vllm_wheel(full, slim_dir)
        sizes = [wheel.stat().st_size / wheelhouse.MIB for wheel in (full, slim)]
        log(f"  {full.name}: {sizes[0]:.0f} MiB, without what is left out {sizes[1]:.0f} MiB")
        log("what vLLM's engine needs beyond the image:")
        needed = requirement_wheels(full, wheels_dir, log)
        if own is None:
            wheelhouse.build_wheels([str(REPO)], wheels_dir)
            own = next(wheels_dir.glob("decodebench-*.whl"))
        needed = wheelhouse.settle(needed, wheels_dir, log)
        wheels = [slim, *needed, own]
        install_for_target(wheels, root / "site")
        model_folder(root / "model")
        contents = {
            "vllm": VLLM,
            "wheels": sorted(w.name for w in wheels),
            "left_out": left_out,
            "not_carried": NOT_CARRIED,
            "model_files": sorted(p.name for p in (root / "model").iterdir()),
        }
        (root / "bundle.json").write_text(json.dumps(contents, indent=1, sort_keys=True))
        log(f"packing (tar.{compression})")
        packed = archive(root, scratch / f"vllm-slim.tar.{compression}", compression)
        parts = wheelhouse.pack([packed], out, part_bytes)
    contents["parts"] = [str(p) for p in parts]
    contents["archive_mib"] = round(sum(wheelhouse.folder_bytes(p) for p in parts) / wheelhouse.MIB, 1)
    return contents


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default=".bundle", help="where the parts go (default .bundle/, which git ignores)")
    parser.add_argument(
        "--part-mib",
        type=float,
        default=None,
        help="the most one part holds, in MiB (default: 64 MiB less this repository's tracked files and 1 MiB)",
    )
    parser.add_argument("--vllm-wheel", type=Path, help=f"vLLM's wheel ({VLLM}), downloaded already")
    parser.add_argument("--wheel", type=Path, help="decodebench's wheel, built already (default: built here)")
    parser.add_argument(
        "--compression", choices=list(COMPRESSIONS), default="xz", help="xz (default: smallest) or gz (faster)"
    )
    args = parser.parse_args(argv)
    part_mib = args.part_mib if args.part_mib is not None else round(wheelhouse.default_part_mib(), 1)
    contents = build(Path(args.out), int(part_mib * wheelhouse.MIB), args.vllm_wheel, args.wheel, args.compression)
    for part in contents["parts"]:
        print(f"{part}: {wheelhouse.folder_bytes(Path(part)) / wheelhouse.MIB:.1f} MiB")
    print(f"{contents['archive_mib']} MiB in {len(contents['parts'])} part(s) of at most {part_mib:g} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
