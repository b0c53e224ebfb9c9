"""A content-keyed cache of the extension's compiled objects: a build on a fresh machine takes
from it every unit whose inputs are unchanged and compiles only the others.

Why: the full CUDA flavor is about 200 units and 6-10 minutes of a 16-core GPU machine, which
starts bare for every session and keeps nothing once idle; most changes touch one or two units
(the GEMM rule is one file). With the objects of an earlier build of the same configuration
carried in, such a change rebuilds in about a minute.

A cache entry is one unit's object plus what it was compiled from: the unit's key is a SHA-256
over the build's fingerprint (flavor, defines, flags, include directories, torch version, the
compilers' ``--version`` output) and the path and content of every file the compiler read for
it (the source and each header, as ninja recorded them). An entry is used only where the key
computed from the files as they are now is the same, so a changed header recompiles every unit
that includes it, and a different compiler or flag recompiles everything. The cache never
decides what a unit contains, only whether it is unchanged.

The cache is a ``tar.xz`` archive (``manifest.json`` and ``objects/<source>.o``, the objects
without their debug information where ``strip`` is found), written in
parts of at most 15 MiB (``NAME.part00``, ``NAME.part01``, ...) so that each part can travel
back from the GPU machine.

* ``setup.py`` reads it when ``CUTLASS_NN_OBJECT_CACHE`` names the archive (its base name or
  its first part): :func:`restore` returns the sources still to compile and the cached objects
  to link.
* ``python3 cutlass_nn/_object_cache.py save BUILD_TEMP ARCHIVE`` writes it after a build
  (``BUILD_TEMP`` is setuptools' ``build/temp.*`` folder, holding ninja's log of the
  dependencies), with the entries :func:`restore` used in that build as well.

It needs only the standard library and the ``ninja`` of torch's builds; it is loaded by path
(``setup.py``) or run as a script, never imported through the ``cutlass_nn`` package.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

FORMAT = 1
MANIFEST = "manifest.json"
PART_BYTES = 15 << 20
#: where restore() extracts the cached objects, and the manifest of those it used
USED_MANIFEST = "used_manifest.json"

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"cutlass_nn build: {msg}", flush=True)


@dataclass
class Entry:
    """One unit: its key, and the files (absolute paths) its key covers."""

    key: str
    deps: list[str]


def _tool_version(command: list[str]) -> str:
    try:
        out = subprocess.run(command + ["--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    return out.stdout.strip()


def fingerprint(config) -> str:
    """SHA-256 of everything about the build that is not a file the compiler reads: the
    extension's configuration (``_build_config.ExtensionConfig``) and the compilers' versions."""
    cuda_home = os.environ.get("CUDA_HOME", "")
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else "nvcc"
    described = {
        "format": FORMAT,
        "flavor": config.flavor,
        "archs": config.archs,
        "define_macros": [list(d) for d in config.define_macros],
        "cxx_flags": config.cxx_flags,
        "nvcc_flags": config.nvcc_flags,
        "include_dirs": config.include_dirs,
        "CC": os.environ.get("CC", ""),
        "CXX": os.environ.get("CXX", ""),
        "cxx_version": _tool_version([os.environ.get("CXX", "c++")]),
        "nvcc_version": _tool_version([nvcc]) if config.with_cuda else "",
        "python": sys.version,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


class _FileHashes:
    """SHA-256 of files, each read once (the units share most of their headers)."""

    def __init__(self) -> None:
        self._seen: dict[str, str | None] = {}

    def __call__(self, path: str) -> str | None:
        if path not in self._seen:
            try:
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                self._seen[path] = h.hexdigest()
            except OSError:
                self._seen[path] = None  # a missing file: no key, the unit is compiled
        return self._seen[path]


def unit_key(print_: str, source: str, deps: Iterable[str], hashes: _FileHashes) -> str | None:
    """The key of ``source`` (a path relative to the checkout) compiled from ``deps`` under
    fingerprint ``print_``, or None where one of the files is missing."""
    h = hashlib.sha256(f"{print_}\0{source}\0".encode())
    for dep in sorted(set(deps)):
        digest = hashes(dep)
        if digest is None:
            return None
        h.update(f"{dep}\0{digest}\0".encode())
    return h.hexdigest()


def object_name(source: str) -> str:
    """Where setuptools puts the object of ``source`` (relative) under its build folder."""
    return os.path.splitext(source)[0] + ".o"


def parse_ninja_deps(text: str) -> dict[str, list[str]]:
    """``ninja -t deps``'s output as ``{output: [inputs]}``, valid records only. A record is a
    line ``OUTPUT: #deps N, deps mtime T (VALID)`` followed by its inputs, one per indented line;
    a record ninja marks STALE (its output newer than the record) is left out."""
    records: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            current = None
            continue
        if line[0].isspace():
            if current is not None:
                current.append(line.strip())
            continue
        output, _, status = line.partition(": #deps")
        if status.rstrip().endswith("(VALID)"):
            current = records.setdefault(output, [])
        else:
            current = None
    return records


def _ninja_deps(build_temp: Path) -> dict[str, list[str]]:
    ninja = shutil.which("ninja")
    if ninja is None:
        raise RuntimeError("object cache: no ninja on PATH to read the build's dependencies")
    out = subprocess.run([ninja, "-C", str(build_temp), "-t", "deps"], capture_output=True,
                         text=True, check=True)
    records = parse_ninja_deps(out.stdout)
    # ninja prints outputs as build.ninja names them: absolute, or relative to its folder
    return {str((build_temp / o).resolve()) if not os.path.isabs(o) else o: d
            for o, d in records.items()}


def _newer_than(paths: Iterable[str], mtime: float) -> bool:
    """Whether a file of ``paths`` is missing or was modified after ``mtime``."""
    for path in paths:
        try:
            if os.stat(path).st_mtime > mtime:
                return True
        except OSError:
            return True
    return False


def _read_parts(archive: str) -> bytes | None:
    """The archive's bytes from its parts (``archive`` is the base name or its first part), or
    None where there is none."""
    base = archive[: -len(".part00")] if archive.endswith(".part00") else archive
    parts = sorted(Path(base).parent.glob(Path(base).name + ".part[0-9][0-9]"))
    if not parts:
        return Path(base).read_bytes() if Path(base).is_file() else None
    return b"".join(p.read_bytes() for p in parts)


def _write_parts(data: bytes, base: str) -> list[Path]:
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    for old in Path(base).parent.glob(Path(base).name + ".part[0-9][0-9]"):
        old.unlink()
    written = []
    for i in range(0, max(len(data), 1), PART_BYTES):
        path = Path(f"{base}.part{i // PART_BYTES:02d}")
        path.write_bytes(data[i:i + PART_BYTES])
        written.append(path)
    return written


def restore(config, archive: str, dest: str, log: Log = _log) -> tuple[list[str], list[str]]:
    """``(sources to compile, objects to link)`` for ``config`` (``_build_config.ExtensionConfig``)
    with the cache at ``archive``: each source whose entry's key matches is replaced by its
    object, extracted under ``dest`` (emptied first). An unreadable or foreign cache changes
    nothing (logged)."""
    sources = list(config.sources)
    shutil.rmtree(dest, ignore_errors=True)
    try:
        data = _read_parts(archive)
        if data is None:
            log(f"object cache: none at {archive}; compiling every unit")
            return sources, []
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:xz")
        manifest = json.load(tar.extractfile(MANIFEST))
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        log(f"object cache: {archive} unreadable ({exc}); compiling every unit")
        return sources, []
    print_ = fingerprint(config)
    if manifest.get("format") != FORMAT or manifest.get("fingerprint") != print_:
        log("object cache: built with another configuration or compiler; compiling every unit")
        return sources, []
    hashes = _FileHashes()
    keep, objects, used = [], [], {}
    for source in sources:
        entry = manifest["units"].get(source)
        if entry is not None and unit_key(print_, source, entry["deps"], hashes) == entry["key"]:
            target = os.path.join(dest, object_name(source))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            member = tar.extractfile("objects/" + object_name(source))
            with open(target, "wb") as f:
                shutil.copyfileobj(member, f)
            objects.append(target)
            used[source] = entry
        else:
            keep.append(source)
    if used:
        with open(os.path.join(dest, USED_MANIFEST), "w") as f:
            json.dump({"format": FORMAT, "fingerprint": print_, "units": used}, f)
    named = ", ".join(os.path.basename(s) for s in keep[:8]) + (", ..." if len(keep) > 8 else "")
    log(f"object cache: {len(objects)} of {len(sources)} units from {archive}, compiling "
        f"{len(keep)}" + (f" ({named})" if keep else ""))
    return keep, objects


def save(config, build_temp: str, archive: str, restored: str | None = None,
         log: Log = _log) -> int:
    """Writes the cache of a finished build to ``archive``'s parts: every unit compiled in
    ``build_temp`` (with the inputs ninja recorded for it) and every unit ``restore`` took from
    an earlier cache into ``restored``. Returns the number of units."""
    build_temp_path = Path(build_temp).resolve()
    deps = _ninja_deps(build_temp_path)
    print_ = fingerprint(config)
    hashes = _FileHashes()
    units: dict[str, dict] = {}
    files: dict[str, str] = {}
    for source in config.sources:
        obj = build_temp_path / object_name(source)
        inputs = deps.get(str(obj))
        # A file changed after the build (newer than the object) would key an object it did not
        # make: such a unit is left out.
        if obj.is_file() and inputs and not _newer_than(inputs, obj.stat().st_mtime):
            key = unit_key(print_, source, inputs, hashes)
            if key is not None:
                units[source] = asdict(Entry(key, sorted(set(inputs))))
                files[source] = str(obj)
    if restored and os.path.isfile(os.path.join(restored, USED_MANIFEST)):
        with open(os.path.join(restored, USED_MANIFEST)) as f:
            used = json.load(f)
        for source, entry in used["units"].items():
            obj = os.path.join(restored, object_name(source))
            # still what it was keyed on (a file could have changed since the restore)
            if (source not in units and used.get("fingerprint") == print_
                    and os.path.isfile(obj)
                    and unit_key(print_, source, entry["deps"], hashes) == entry["key"]):
                units[source] = entry
                files[source] = obj
    manifest = {"format": FORMAT, "fingerprint": print_, "units": units}
    strip = shutil.which("strip")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=6) as tar, \
            tempfile.TemporaryDirectory() as tmp:
        blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
        for source in sorted(files):
            # Without the host code's debug information (the compilers' -g: about 97% of a CPU
            # unit's object), which the extension does not need; the code is unchanged.
            obj = files[source]
            if strip:
                stripped = os.path.join(tmp, "unit.o")
                shutil.copyfile(obj, stripped)
                done = subprocess.run([strip, "--strip-debug", stripped], capture_output=True)
                if done.returncode == 0:
                    obj = stripped
            tar.add(obj, arcname="objects/" + object_name(source), recursive=False)
    parts = _write_parts(buf.getvalue(), archive)
    log(f"object cache: {len(units)} of {len(config.sources)} units saved to {archive} "
        f"({len(buf.getvalue()) / 2**20:.1f} MiB in {len(parts)} part(s))")
    return len(units)


def _load_build_config():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_config.py")
    spec = importlib.util.spec_from_file_location("_cutlass_nn_build_config", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or argv[0] != "save":
        print("usage: python3 cutlass_nn/_object_cache.py save BUILD_TEMP ARCHIVE [RESTORED_DIR]",
              file=sys.stderr)
        return 2
    config = _load_build_config().extension_config(log=lambda msg: None)
    restored = argv[3] if len(argv) == 4 else None
    return 0 if save(config, argv[1], argv[2], restored) > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
