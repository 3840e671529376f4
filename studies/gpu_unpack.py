"""Unpacks a wheelhouse of studies/gpu_wheelhouse.py (or the slim vLLM of studies/gpu_vllm_bundle.py) on a machine
without a network (standard library only).

    python3 wheelhouse/part-1/unpack.py wheelhouse [--check-only] [--target DIR]
    python3 bundle/part-1/unpack.py bundle --extract DIR

It finds the parts under the folder given, joins the pieces of every wheel, checks each wheel's sha256 against the
manifest, and installs them all with pip into this interpreter's environment, offline and without dependencies
(the wheelhouse holds every one the image lacks). ``--target DIR`` installs into a folder instead: put it on
PYTHONPATH, and note that Python reads .pth files only from site folders, so lm-eval then finds decodebench's models
only after ``import site; site.addsitedir(DIR)``. ``--extract DIR`` unpacks a bundle's checked archive into DIR
instead of installing anything (its ``site`` folder goes on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


def joined_wheels(wheelhouse: Path, into: Path) -> list[Path]:
    """Every wheel of the manifest, joined from its pieces into ``into`` and checked; a missing part or piece and a
    wrong checksum are errors that name what is wrong."""
    parts = sorted(wheelhouse.glob("part-*"), key=lambda p: int(p.name.split("-")[1]))
    if not parts:
        raise SystemExit(f"{wheelhouse}: no part-N folders here")
    manifest = json.loads((parts[0] / "manifest.json").read_text())
    found = {p.name.split("-")[1] for p in parts}
    missing_parts = [str(n) for n in range(1, manifest["parts"] + 1) if str(n) not in found]
    if missing_parts:
        raise SystemExit(f"{wheelhouse}: part(s) {', '.join(missing_parts)} of {manifest['parts']} are missing")
    files = {f.name: f for part in parts for f in part.iterdir()}
    wheels = []
    for name, entry in manifest["wheels"].items():
        absent = [piece for piece in entry["pieces"] if piece not in files]
        if absent:
            raise SystemExit(f"{name}: pieces {absent} are in none of the parts")
        data = b"".join(files[piece].read_bytes() for piece in entry["pieces"])
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise SystemExit(f"{name}: its sha256 differs from the manifest's (a damaged copy): carry it again")
        (into / name).write_bytes(data)
        wheels.append(into / name)
    return wheels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("wheelhouse", help="the folder holding part-1, part-2, ...")
    parser.add_argument("--check-only", action="store_true", help="join and check every wheel, install nothing")
    parser.add_argument("--target", default=None, help="install into this folder instead of the environment")
    parser.add_argument("--extract", default=None, help="unpack a bundle's archive into this folder, install nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        wheels = joined_wheels(Path(args.wheelhouse), Path(scratch))
        print(f"{len(wheels)} {'files' if args.extract else 'wheels'} joined and checked")
        if args.check_only:
            return 0
        if args.extract:
            for archive in wheels:
                with tarfile.open(archive) as tar:
                    tar.extractall(args.extract, filter="data")
            print(f"unpacked into {args.extract}")
            return 0
        target = ["--target", args.target] if args.target else []
        command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", *target]
        return subprocess.call([*command, *map(str, wheels)])


if __name__ == "__main__":
    raise SystemExit(main())
