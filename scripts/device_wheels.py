"""The GPU check's carry (docs/gpu-check.md): which wheels travel to the GPU machine, whether they fit the
64 MiB that travels, and, there, whether the image and the carried wheels meet loopnet's requirements.

    python scripts/device_wheels.py pins          name==version of each wheel to carry (make device-wheels)
    python scripts/device_wheels.py platforms     pip download's --platform options for the image
    python scripts/device_wheels.py size .whl     the wheels + the working tree that travels: <= 64 MiB, else exit 1
    python scripts/device_wheels.py check --site /tmp/site    on the GPU machine: every requirement met

A wheel is carried when loopnet (or a carried package) needs it and the image, as scripts/gpu_image.json
records it, lacks it or holds a version that fails the requirement; at the version installed here (.venv:
the versions the test suite runs with). A package the image holds at an unrecorded version is not carried:
`check` tests it there, in the check's first seconds. Packages in `data_only` are read as files (their data),
never imported: their own requirements are not followed.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import subprocess
import sys
import tomllib
import zlib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
IMAGE = Path(__file__).with_name("gpu_image.json")
CARRY_LIMIT = 64 * 2**20  # what the device tool carries to the GPU machine: the working tree and the wheels


def load_image(path: Path = IMAGE) -> dict:
    image = json.loads(path.read_text())
    image["packages"] = {canonicalize_name(k): v for k, v in image["packages"].items()}
    image["data_only"] = {canonicalize_name(n) for n in image["data_only"]}
    return image


def loopnet_requirements() -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]


def applies(req: Requirement, python: str, extras: set[str]) -> bool:
    """Whether `req` applies on the image (Linux x86_64, CPython `python`) with these extras requested."""
    if req.marker is None:
        return True
    env = default_environment() | {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    return any(req.marker.evaluate(env | {"extra": extra}) for extra in extras | {""})


def meets(req: Requirement, version: str) -> bool:
    return req.specifier.contains(Version(version), prereleases=True)


def carried(image: dict, installed=md.version, requires=md.requires) -> list[tuple[str, str, str]]:
    """(name, version here, why) of every wheel to carry, in the order found. `installed(name)` and
    `requires(name)` read this environment (importlib.metadata's by default)."""
    found: dict[str, tuple[str, str, str]] = {}
    queue = [(req, "loopnet") for req in loopnet_requirements()]
    while queue:
        req, by = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in found:
            continue
        held = image["packages"].get(name, "absent")
        if held is None or (held != "absent" and meets(req, held)):
            continue  # the image's (unrecorded versions: `check` tests them there)
        why = "absent from the image" if held == "absent" else f"the image's {held} fails {by}'s {req}"
        version = installed(req.name)
        if not meets(req, version):
            raise SystemExit(f"device_wheels: {req.name} {version} here fails {by}'s {req}; fix: `make setup`")
        found[name] = (req.name, version, why)
        if name not in image["data_only"]:
            queue += [
                (Requirement(r), req.name)
                for r in requires(req.name) or []
                if applies(Requirement(r), image["python"], set(req.extras))
            ]
    if "torch" in found:  # hundreds of MB: never carried, the check runs on the image's torch
        raise SystemExit(
            f"device_wheels: torch would be carried ({found['torch'][2]}); fix: loopnet's torch "
            f"requirement must accept the image's torch (scripts/gpu_image.json)"
        )
    return list(found.values())


def _recorded_files(name: str) -> list:
    """A package's files as its RECORD lists them, the .pyc files left out (compiled here, not in its wheel)."""
    return [f for f in md.distribution(name).files or [] if not f.name.endswith(".pyc")]


def installed_size(name: str) -> int:
    """Bytes of a package as installed here (its RECORD): what its wheel unpacks to."""
    return sum(f.size or 0 for f in _recorded_files(name))


def wheel_size(name: str) -> int:
    """Bytes its wheel would take, offline: each installed file deflated at zipfile's default level, as a wheel
    stores it, plus each entry's zip headers (local + central, the name written twice). Files installed here
    that are not in the wheel (console scripts, INSTALLER, direct_url.json) count too: an over-estimate."""
    total = 0
    for f in _recorded_files(name):
        path = Path(f.locate())
        if path.is_file():
            total += len(zlib.compress(path.read_bytes(), 6)) + 76 + 2 * len(str(f).encode())
    return total


def travelling_files() -> list[Path]:
    """What the device tool sends besides `carry`: tracked and untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    return [ROOT / p for p in listed if p and (ROOT / p).is_file() and not (ROOT / p).is_symlink()]


def size(wheels: Path) -> int:
    tree = sum(p.stat().st_size for p in travelling_files())
    whl = sum(p.stat().st_size for p in wheels.glob("*.whl"))
    total = tree + whl
    print(
        f"carry: working tree {tree / 2**20:.1f} MiB + {wheels} {whl / 2**20:.1f} MiB = {total / 2**20:.1f} MiB "
        f"(limit {CARRY_LIMIT / 2**20:.0f} MiB)"
    )
    if total > CARRY_LIMIT:
        print(
            f"device_wheels: {total / 2**20:.1f} MiB would travel, over the {CARRY_LIMIT / 2**20:.0f} MiB limit; "
            f"fix: record in scripts/gpu_image.json what the image holds, so it is not carried",
            file=sys.stderr,
        )
        return 1
    return 0


def check(site: Path) -> int:
    """On the GPU machine: loopnet's requirements, and those of each carried package (under `site`), met by what
    imports there. One line per failure, naming the fix; the image's versions of the recorded packages listed."""
    image = load_image()
    carried_here = {canonicalize_name(d.metadata["Name"]) for d in md.distributions(path=[str(site)])}
    failures, queue, seen = [], [(req, "loopnet") for req in loopnet_requirements()], set()
    while queue:
        req, by = queue.pop(0)
        name = canonicalize_name(req.name)
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            failures.append(
                f"{by} needs {req}, which is neither in the image nor carried; fix: record it as absent "
                f"(remove it from scripts/gpu_image.json) and rerun make device-wheels"
            )
            continue
        if not meets(req, version):
            where = "carried" if name in carried_here else "the image's"
            failures.append(
                f"{by} needs {req}, {where} {req.name} is {version}; fix: record {req.name} {version} in "
                f"scripts/gpu_image.json and rerun make device-wheels (it is then carried)"
            )
        if name in seen or name not in carried_here or name in image["data_only"]:
            continue  # the image's own packages answer for their own requirements
        seen.add(name)
        queue += [
            (Requirement(r), req.name)
            for r in md.requires(req.name) or []
            if applies(Requirement(r), image["python"], set(req.extras))
        ]
    changed, unrecorded = [], []
    for name, version in image["packages"].items():
        try:
            there = md.version(name) if name not in carried_here else "carried"
        except md.PackageNotFoundError:
            there = "absent"
        if version is None:
            unrecorded.append(f"{name} {there}")
        elif there != version:
            changed.append(f"{name} {there} (recorded {version})")
    print("image vs scripts/gpu_image.json:", "; ".join(changed) or "as recorded")
    print("image, versions unrecorded there:", ", ".join(unrecorded) or "none")
    for line in failures:
        print(f"device_wheels: {line}", file=sys.stderr)
    return 1 if failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    pins = sub.add_parser("pins", help="name==version of each wheel to carry")
    pins.add_argument("--why", action="store_true", help="with the reason and the wheel size of each")
    sub.add_parser("platforms", help="pip download's --platform options")
    sized = sub.add_parser("size", help="the wheels and the travelling working tree against the 64 MiB limit")
    sized.add_argument("wheels", type=Path)
    checked = sub.add_parser("check", help="on the GPU machine: every requirement met")
    checked.add_argument("--site", type=Path, default=Path("/tmp/site"), help="where the carried wheels are installed")
    args = parser.parse_args()
    if args.command == "pins":
        rows = carried(load_image())
        for name, version, why in rows:
            print(
                f"{name}=={version}"
                + (f"  # {why}; {wheel_size(name) / 2**20:.2f} MiB as a wheel (estimated)" if args.why else "")
            )
        if args.why:
            print(f"# {sum(wheel_size(n) for n, _, _ in rows) / 2**20:.1f} MiB as wheels in all (estimated)")
    elif args.command == "platforms":
        print(" ".join(f"--platform {p}" for p in load_image()["platforms"]))
    elif args.command == "size":
        sys.exit(size(args.wheels))
    else:
        sys.exit(check(args.site))


if __name__ == "__main__":
    main()
