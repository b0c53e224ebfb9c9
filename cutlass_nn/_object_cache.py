"""A content-keyed cache of the extension's compiled objects: a build on a fresh machine takes
from it every unit whose inputs are unchanged and compiles only the others.

Why: the full CUDA flavor is about 200 units and 6-12 minutes of a 16-core GPU machine, which
starts bare for every session and keeps nothing once idle; most changes touch one or two units
(the GEMM rule is one file). With the objects of an earlier build of the same configuration
carried in, such a change needs only those units compiled.

Correctness comes first: a stale object linked into the extension would be a silent wrong build.
So:

* A unit's key is a SHA-256 over the build's fingerprint and the path and content of every file
  the compiler read for it (the source and each header, from ninja's dependency log). The
  fingerprint covers the checkout's location, the flavor, defines, flags and include directories,
  the torch version, the host and CUDA compilers (path and ``--version``), ``setup.py``'s debug
  flag and the environment variables torch's build and nvcc read (:data:`BUILD_ENVIRONMENT`). An
  entry is used only where the key computed from the files as they are now is the same.
* ``setup.py`` calls :func:`begin_build` before every build: it writes the run record
  ``build/object_cache_run.json`` (once per build folder: the fingerprint, the start time, the
  sources, and the content hash of every file under ``csrc/`` at that moment). :func:`save` files
  a unit only if its object was written after that start, no file it read is newer than the
  object, and every file of the checkout it read still has the content recorded at the start:
  an object ninja did not rebuild (an edit that kept an old modification time) or a file edited
  during or after the build is left out, never keyed to content it was not compiled from. The
  fingerprint is the one the build computed, not recomputed at save time.
* :func:`restore` never fails a build: a missing, truncated, foreign or unreadable cache is logged
  and every unit is compiled.

The cache is a ``tar.xz`` archive (``manifest.json`` and ``objects/<source>.o``, the objects
without their debug information where ``strip`` is found), written in parts of at most 15 MiB
(``NAME.part00``, ``NAME.part01``, ...) so that each can travel back from the GPU machine.

* ``setup.py`` reads it when ``CUTLASS_NN_OBJECT_CACHE`` names the archive (its base name or its
  first part): :func:`restore` returns the sources still to compile and the cached objects to link.
* ``python3 cutlass_nn/_object_cache.py save BUILD_TEMP ARCHIVE [RESTORED_DIR] [--previous
  EARLIER]`` writes it after a build (``BUILD_TEMP`` is setuptools' ``build/temp.*`` folder,
  where ninja keeps its dependency log), with the entries :func:`restore` used in that build
  (``RESTORED_DIR``, by default ``build/object_cache``) as well, and those of an earlier save of
  the same build (``EARLIER``) whose inputs still hash to what they were keyed on: a build
  resumed in a later call of a machine that copies the checkout afresh into each call (the GPU
  machine) is saved in the call that compiles, and again, whole, in the call that finishes.

It needs only the standard library and the ``ninja`` of torch's builds; it is loaded by path
(``setup.py``) or run as a script, never imported through the ``cutlass_nn`` package.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

FORMAT = 2
MANIFEST = "manifest.json"
PART_BYTES = 15 << 20
#: the manifest of the entries restore() used, next to the objects it extracted
USED_MANIFEST = "used_manifest.json"
#: the checkout (the folder holding setup.py, csrc/ and cutlass_nn/)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the checkout's compiler inputs, whose content the run record keeps
CSRC = os.path.join(ROOT, "csrc")
#: the run record begin_build() writes, once per build folder
RUN_RECORD = os.path.join(ROOT, "build", "object_cache_run.json")
#: where setup.py has restore() extract the cached objects
RESTORED_DIR = os.path.join(ROOT, "build", "object_cache")
#: environment variables that torch's extension build or nvcc read and that change the objects
BUILD_ENVIRONMENT = (
    "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "PYTORCH_NVCC",
    "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "TORCH_CUDA_ARCH_LIST",
    "CUDA_HOME", "CUDA_PATH",
)

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"cutlass_nn build: {msg}", flush=True)


def _tool_version(command: str) -> str:
    """``command --version`` (path and output), or why it could not run."""
    path = shutil.which(command) or command
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             errors="replace", stdin=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path}: unavailable: {exc}"
    return f"{path}: {out.stdout.strip()}"


def fingerprint(config, cuda_home: str | None = None, debug: bool = False) -> str:
    """SHA-256 of everything about the build that is not a file the compiler reads: the
    checkout's location, the extension's configuration (``_build_config.ExtensionConfig``), the
    compilers, ``setup.py``'s debug flag and :data:`BUILD_ENVIRONMENT`. ``cuda_home`` is the
    toolkit torch's build uses (``torch.utils.cpp_extension.CUDA_HOME``)."""
    env = {name: os.environ.get(name, "") for name in BUILD_ENVIRONMENT}
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else "nvcc"
    described = {
        "format": FORMAT,
        "root": ROOT,
        "flavor": config.flavor,
        "archs": config.archs,
        "define_macros": [list(d) for d in config.define_macros],
        "cxx_flags": config.cxx_flags,
        "nvcc_flags": config.nvcc_flags,
        "include_dirs": config.include_dirs,
        "environment": env,
        "cxx": _tool_version(env["CXX"] or "c++"),
        # nvcc's host compiler without CC / NVCC_CCBIN: the gcc / g++ found on PATH
        "cc": _tool_version(env["CC"]) if env["CC"] else "",
        "gcc": _tool_version("gcc"),
        "g++": _tool_version("g++"),
        "nvcc": _tool_version(nvcc) if config.with_cuda else "",
        "cuda_home": cuda_home or "",
        "debug": bool(debug),
        "python": sys.version,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


class _FileHashes:
    """SHA-256 of files, each read once (the units share most of their headers), and the files
    under csrc/ by name (:meth:`namesakes`)."""

    def __init__(self) -> None:
        self._seen: dict[str, str | None] = {}
        self._by_name: dict[str, list[str]] | None = None

    def namesakes(self, path: str) -> list[str]:
        """The files under csrc/ named like ``path``: a new one could be the file an include
        now finds instead of ``path`` (earlier on the include path), so they enter the key."""
        if self._by_name is None:
            self._by_name = {}
            for folder, _, names in os.walk(CSRC):
                for name in names:
                    self._by_name.setdefault(name, []).append(os.path.join(folder, name))
        return sorted(self._by_name.get(os.path.basename(path), []))

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
    """The key of ``source`` (a path relative to the checkout) compiled from ``deps`` (absolute
    paths) under fingerprint ``print_``, or None where one of the files is missing."""
    h = hashlib.sha256(f"{print_}\0{source}\0".encode())
    for dep in sorted(set(deps) | {os.path.join(ROOT, source)}):
        digest = hashes(dep)
        if digest is None:
            return None
        h.update(f"{dep}\0{digest}\0{chr(1).join(hashes.namesakes(dep))}\0".encode())
    return h.hexdigest()


def object_name(source: str) -> str:
    """Where setuptools puts the object of ``source`` (relative) under its build folder."""
    return os.path.splitext(source)[0] + ".o"


def _checkout_files() -> dict[str, str]:
    """Content hashes of the checkout's compiler inputs (every file under csrc/), by path."""
    hashes = _FileHashes()
    found = {}
    for folder, _, names in os.walk(CSRC):
        for name in names:
            path = os.path.join(folder, name)
            digest = hashes(path)
            if digest is not None:
                found[path] = digest
    return found


def begin_build(config, cuda_home: str | None = None, debug: bool = False,
                record: str = RUN_RECORD, log: Log = _log) -> str:
    """Called by setup.py before every build: the build's fingerprint, and the run record
    ``record`` written unless one of this fingerprint is there already (a build resumed in the
    same folder keeps the start of its first run). Never raises: a record that cannot be written
    only means nothing of this build can be saved."""
    print_ = fingerprint(config, cuda_home, debug)
    try:
        with open(record) as f:
            if json.load(f).get("fingerprint") == print_:
                # A later run in the same folder keeps the first run's start and csrc/ content:
                # a file changed since then keys no unit (save compares against the record).
                return print_
    except (OSError, ValueError, AttributeError):
        pass
    try:
        os.makedirs(os.path.dirname(record), exist_ok=True)
        run = {"format": FORMAT, "fingerprint": print_, "start": time.time(),
               "sources": list(config.sources), "files": _checkout_files()}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(record), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(run, f)
        os.replace(tmp, record)
    except OSError as exc:
        log(f"object cache: cannot write the run record {record} ({exc}); this build cannot be saved")
    return print_


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


def _ninja_deps(build_temp: str) -> dict[str, list[str]]:
    """The dependency log of the build in ``build_temp``, every path absolute (ninja names them
    relative to that folder where build.ninja does). ninja lists only the outputs of the current
    build.ninja, so objects left over from other builds in the folder do not appear."""
    ninja = shutil.which("ninja")
    if ninja is None:
        raise RuntimeError("object cache: no ninja on PATH to read the build's dependencies")
    out = subprocess.run([ninja, "-C", build_temp, "-t", "deps"], capture_output=True, text=True,
                         check=True)

    def absolute(path: str) -> str:
        return os.path.abspath(os.path.join(build_temp, path))

    return {absolute(o): [absolute(d) for d in deps]
            for o, deps in parse_ninja_deps(out.stdout).items()}


def _part_paths(base: str) -> list[Path]:
    return sorted(Path(base).parent.glob(Path(base).name + ".part[0-9][0-9]"))


def _base_name(archive: str) -> str:
    return archive[: -len(".part00")] if archive.endswith(".part00") else archive


def _read_parts(archive: str) -> bytes | None:
    """The archive's bytes from its parts (``archive`` is the base name or its first part), or
    None where there is none."""
    base = _base_name(archive)
    parts = _part_paths(base)
    if not parts:
        return Path(base).read_bytes() if Path(base).is_file() else None
    names = [p.name for p in parts]
    expected = [f"{Path(base).name}.part{i:02d}" for i in range(len(parts))]
    if names != expected:
        raise ValueError(f"the parts are not numbered 00 to {len(parts) - 1:02d}: {names}")
    return b"".join(p.read_bytes() for p in parts)


def _write_parts(data: bytes, base: str) -> list[Path]:
    """Writes ``data`` as ``base``'s parts: all new parts first under temporary names, then the old
    parts removed and the new ones renamed, so an interrupted save leaves an old or a broken
    set, which restore() reads as no cache."""
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    fresh = []
    for i in range(0, max(len(data), 1), PART_BYTES):
        path = Path(f"{base}.part{i // PART_BYTES:02d}")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data[i:i + PART_BYTES])
        fresh.append((tmp, path))
    for old in _part_paths(base):
        old.unlink()
    for tmp, path in fresh:
        tmp.replace(path)
    return [path for _, path in fresh]


def _cheapest(sources: list[str]) -> str:
    """The source to compile when every unit is cached (torch's build needs one): the smallest
    C++ file, else the smallest of all."""
    cxx = [s for s in sources if s.endswith(".cpp")] or sources
    return min(cxx, key=lambda s: os.path.getsize(os.path.join(ROOT, s)))


class _ForeignCache(Exception):
    """An archive made under another fingerprint or format."""


def _extract(archive: str, print_: str, dest: str,
             take: Callable[[str, dict], bool]) -> dict | None:
    """The entries of the cache at ``archive`` that ``take(source, entry)`` chooses, their
    objects extracted under ``dest``; None where there is no archive. Raises
    :class:`_ForeignCache` for an archive of another fingerprint or format, and whatever reading
    it raises (truncated, unreadable, an object missing)."""
    data = _read_parts(archive)
    if data is None:
        return None
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        manifest = json.load(tar.extractfile(MANIFEST))
        if manifest.get("format") != FORMAT or manifest.get("fingerprint") != print_:
            raise _ForeignCache(archive)
        chosen = {source: entry for source, entry in manifest["units"].items()
                  if take(source, entry)}
        # one pass over the archive, in its order (each seek back in an xz stream would
        # decompress it from the start again)
        wanted = {"objects/" + object_name(source): source for source in chosen}
        for member in tar:
            if member.name in wanted:
                target = os.path.join(dest, object_name(wanted.pop(member.name)))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as f:
                    shutil.copyfileobj(src, f)
        if wanted:
            raise KeyError(f"objects missing from the archive: {sorted(wanted)[:3]}")
    return chosen


def restore(config, archive: str, print_: str, dest: str = RESTORED_DIR,
            log: Log = _log) -> tuple[list[str], list[str]]:
    """``(sources to compile, objects to link)`` for ``config`` (``_build_config.ExtensionConfig``)
    under fingerprint ``print_`` (:func:`begin_build`'s) with the cache at ``archive``: each source
    whose entry's key matches is replaced by its object, extracted under ``dest`` (emptied first).
    Anything wrong with the cache (missing, truncated, foreign, unreadable) is logged and every
    unit compiled."""
    sources = list(config.sources)
    shutil.rmtree(dest, ignore_errors=True)
    hashes = _FileHashes()
    try:
        used = _extract(archive, print_, dest, lambda source, entry: source in sources and
                        unit_key(print_, source, entry["deps"], hashes) == entry["key"])
        if used is None:
            log(f"object cache: none at {archive}; compiling every unit")
            return sources, []
    except _ForeignCache:
        log("object cache: made by another checkout, configuration or compiler; "
            "compiling every unit")
        return sources, []
    except Exception as exc:  # noqa: BLE001 - any failure of the cache means: compile everything
        shutil.rmtree(dest, ignore_errors=True)
        log(f"object cache: {archive} unusable ({type(exc).__name__}: {exc}); compiling every unit")
        return sources, []
    keep = [source for source in sources if source not in used]
    objects = [os.path.join(dest, object_name(source)) for source in sources if source in used]
    if not keep:
        # torch's build needs at least one source to compile
        source = _cheapest(sources)
        keep.append(source)
        objects.remove(os.path.join(dest, object_name(source)))
        del used[source]
    if used:
        with open(os.path.join(dest, USED_MANIFEST), "w") as f:
            json.dump({"format": FORMAT, "fingerprint": print_, "units": used}, f)
    named = ", ".join(os.path.basename(s) for s in keep[:8]) + (", ..." if len(keep) > 8 else "")
    log(f"object cache: {len(objects)} of {len(sources)} units from {archive}, compiling "
        f"{len(keep)} ({named})")
    return keep, objects


def _compiled_in_this_build(obj: str, inputs: list[str], start: float, run: dict,
                            hashes: _FileHashes) -> bool:
    """Whether ``obj`` was made by this build from its inputs as they are now: written at or
    after the run's ``start``, no input modified or changed in any way after it (the later of a
    file's modification and status-change times: a copy or an unpacked archive can set the
    first back, not the second), and each input under csrc/ with the content it had at the
    start (a file that did not exist then: left out too)."""
    try:
        made = os.stat(obj).st_mtime
    except OSError:
        return False
    if made < start:
        return False
    for path in inputs:
        try:
            info = os.stat(path)
        except OSError:
            return False
        if max(info.st_mtime, info.st_ctime) > made:
            return False
        if path.startswith(CSRC + os.sep) and run["files"].get(path) != hashes(path):
            return False
    return True


def _xz(data: bytes, log: Log = _log) -> bytes:
    """``data`` compressed to the xz format at preset 6: with the ``xz`` tool on all cores where
    it is found (the full CUDA flavor's objects are a few hundred MB, about a minute for one
    core of the GPU machine, out of its device time), else with Python's single-threaded lzma.
    Both write the standard format that ``restore`` reads."""
    tool = shutil.which("xz")
    if tool:
        done = subprocess.run([tool, "-6", "-T0", "-c"], input=data, capture_output=True)
        if done.returncode == 0 and done.stdout:
            return done.stdout
        log(f"object cache: {tool} failed (exit code {done.returncode}); compressing with "
            "Python's lzma on one core instead")
    return lzma.compress(data, preset=6)


def _carry(units: dict, files: dict, entries: dict, object_dir: str, print_: str,
           hashes: _FileHashes) -> int:
    """Adds to ``units`` / ``files`` the ``entries`` (``{source: {"key", "deps"}}``, objects
    under ``object_dir``) of sources not already there whose key, computed from the files as
    they are now, is still the entry's: an object keyed on content is valid while that content
    is. Returns how many it added."""
    added = 0
    for source, entry in entries.items():
        obj = os.path.join(object_dir, object_name(source))
        if (source not in units and os.path.isfile(obj)
                and unit_key(print_, source, entry["deps"], hashes) == entry["key"]):
            units[source] = entry
            files[source] = obj
            added += 1
    return added


def _unpack_previous(archive: str, print_: str, sources: set[str], dest: str, log: Log) -> dict:
    """The entries of an earlier save of this build (``archive``) under fingerprint ``print_``
    for ``sources``, their objects extracted under ``dest``; none where the archive is missing,
    unreadable or of another fingerprint (logged). Their keys are checked by :func:`_carry`."""
    try:
        entries = _extract(archive, print_, dest, lambda source, entry: source in sources)
    except _ForeignCache:
        log(f"object cache: the earlier save {archive} is of another build; not carried")
        return {}
    except Exception as exc:  # noqa: BLE001 - an unusable earlier save only carries nothing
        log(f"object cache: the earlier save {archive} is unusable ({type(exc).__name__}: {exc}); "
            "not carried")
        return {}
    if entries is None:
        log(f"object cache: no earlier save at {archive}")
        return {}
    return entries


def save(build_temp: str, archive: str, restored: str | None = RESTORED_DIR,
         record: str = RUN_RECORD, log: Log = _log, previous: str | None = None) -> int:
    """Writes the cache of a finished build to ``archive``'s parts: the units compiled by this
    build (:func:`_compiled_in_this_build`) with the inputs ninja recorded for them, and the
    units :func:`restore` took from an earlier cache into ``restored``, still matching. Uses the
    run record ``record`` of :func:`begin_build`. Returns the number of units.

    ``previous`` names the archive of an earlier save of the same build (a build run over two
    calls of a machine that copies the checkout afresh into each call: the second call's files
    are newer than the first call's objects, which :func:`_compiled_in_this_build` then rightly
    leaves out); its units are carried where this build did not compile them and their inputs
    still have the content they were keyed on."""
    with open(record) as f:
        run = json.load(f)
    if run.get("format") != FORMAT:
        raise RuntimeError(f"object cache: {record} is of another format; rebuild first")
    # the run's start on the file system's own clock and granularity (an object written in the
    # same tick as the record is not older than it)
    start = min(run["start"], os.stat(record).st_mtime)
    print_ = run["fingerprint"]
    build_temp = os.path.abspath(build_temp)
    deps = _ninja_deps(build_temp)
    hashes = _FileHashes()
    units: dict[str, dict] = {}
    files: dict[str, str] = {}
    for source in run["sources"]:
        obj = os.path.join(build_temp, object_name(source))
        inputs = deps.get(obj)
        if inputs and _compiled_in_this_build(obj, inputs, start, run, hashes):
            key = unit_key(print_, source, inputs, hashes)
            if key is not None:
                units[source] = {"key": key, "deps": sorted(set(inputs))}
                files[source] = obj
    compiled = len(units)
    sources = set(run["sources"])
    with tempfile.TemporaryDirectory() as tmp:
        carried = 0
        if restored and os.path.isfile(os.path.join(restored, USED_MANIFEST)):
            with open(os.path.join(restored, USED_MANIFEST)) as f:
                used = json.load(f)
            if used.get("fingerprint") == print_:
                carried += _carry(units, files, used["units"], restored, print_, hashes)
        earlier = 0
        if previous:
            entries = _unpack_previous(previous, print_, sources, os.path.join(tmp, "previous"),
                                       log)
            earlier = _carry(units, files, entries, os.path.join(tmp, "previous"), print_, hashes)
        # Each object copied (without the host code's debug information: the compilers' -g,
        # about 97% of a CPU unit's object, which the extension does not need; the code is
        # unchanged) and kept only if the file did not change while it was read: a compiler
        # that outlived a stopped build could still be writing it.
        strip = shutil.which("strip")
        copies: dict[str, str] = {}
        for source in sorted(files):
            obj = files[source]
            before = os.stat(obj)
            copy = os.path.join(tmp, "copies", object_name(source))
            os.makedirs(os.path.dirname(copy), exist_ok=True)
            shutil.copyfile(obj, copy)
            if strip and subprocess.run([strip, "--strip-debug", copy],
                                        capture_output=True).returncode != 0:
                shutil.copyfile(obj, copy)  # as compiled, where strip failed
            after = os.stat(obj)
            if (before.st_mtime_ns, before.st_size) != (after.st_mtime_ns, after.st_size):
                log(f"object cache: {obj} changed while it was saved; left out")
                del units[source]
                continue
            copies[source] = copy
        manifest = {"format": FORMAT, "fingerprint": print_, "units": units}
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            # the manifest first: restore reads it, then the objects in one pass
            blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
            for source in sorted(copies):
                tar.add(copies[source], arcname="objects/" + object_name(source), recursive=False)
    data = _xz(buf.getvalue(), log)
    parts = _write_parts(data, archive)
    log(f"object cache: {len(units)} of {len(run['sources'])} units saved to {archive} "
        f"({compiled} compiled by this build, {carried} from the cache it used, {earlier} from "
        f"its earlier save; {len(data) / 2**20:.1f} MiB in {len(parts)} part(s))")
    return len(units)


def main(argv: list[str]) -> int:
    usage = ("usage: python3 cutlass_nn/_object_cache.py save BUILD_TEMP ARCHIVE [RESTORED_DIR] "
             "[--previous EARLIER_ARCHIVE]")
    previous = None
    if "--previous" in argv:
        at = argv.index("--previous")
        if at + 1 >= len(argv):
            print(usage, file=sys.stderr)
            return 2
        previous = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    if len(argv) not in (3, 4) or argv[0] != "save":
        print(usage, file=sys.stderr)
        return 2
    restored = argv[3] if len(argv) == 4 else RESTORED_DIR
    return 0 if save(argv[1], argv[2], restored, previous=previous) > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
