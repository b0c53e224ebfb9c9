"""cutlass_nn/_object_cache.py: the content-keyed cache of compiled objects that lets a build on
a fresh machine compile only the units whose inputs changed. No compiler runs here: the units
are small files standing in for sources, headers and objects, and ninja's dependency log is
given as text."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_oc_under_test", ROOT / "cutlass_nn" / "_object_cache.py")
oc = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = oc
_spec.loader.exec_module(oc)


@dataclass
class FakeConfig:
    """The fields of _build_config.ExtensionConfig that the cache reads."""

    sources: list[str]
    with_cuda: bool = False
    archs: list[str] = field(default_factory=list)
    define_macros: list[tuple[str, str]] = field(default_factory=lambda: [("A", "1")])
    cxx_flags: list[str] = field(default_factory=lambda: ["-O3"])
    nvcc_flags: list[str] = field(default_factory=list)
    include_dirs: list[str] = field(default_factory=list)

    @property
    def flavor(self) -> str:
        return "cuda" if self.with_cuda else "cpu"


@pytest.fixture()
def build(tmp_path, monkeypatch):
    """Three units over two headers, "compiled" into build/temp (objects named as setuptools
    names them), with ninja's dependency log pointing at the files."""
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "common.h").write_text("// common\n")
    (src / "only_b.h").write_text("// b\n")
    deps = {"csrc/a.cpp": ["common.h"], "csrc/b.cpp": ["common.h", "only_b.h"],
            "csrc/c.cpp": []}
    temp = tmp_path / "build" / "temp"
    log_lines = []
    for source, headers in deps.items():
        (tmp_path / source).write_text(f"// {source}\n")
        obj = temp / oc.object_name(source)
        obj.parent.mkdir(parents=True, exist_ok=True)
        obj.write_bytes(f"object of {source}".encode())
        inputs = [str(tmp_path / source)] + [str(src / h) for h in headers]
        log_lines.append(f"{obj}: #deps {len(inputs)}, deps mtime 1 (VALID)")
        log_lines += [f"    {i}" for i in inputs]
        log_lines.append("")
    text = "\n".join(log_lines)
    monkeypatch.setattr(oc, "_ninja_deps", lambda build_temp: oc.parse_ninja_deps(text))
    monkeypatch.setattr(oc, "_tool_version", lambda command: "fake compiler 1.0")
    monkeypatch.chdir(tmp_path)
    return tmp_path, temp, FakeConfig(sources=list(deps))


def quiet(msg: str) -> None:
    pass


def test_parse_ninja_deps_keeps_valid_records_only():
    text = ("/b/x.o: #deps 2, deps mtime 5 (VALID)\n    /s/x.cpp\n    /s/h.h\n\n"
            "/b/y.o: #deps 1, deps mtime 5 (STALE)\n    /s/y.cpp\n\n"
            "z.o: #deps 1, deps mtime 7 (VALID)\n    /s/z.cpp\n")
    assert oc.parse_ninja_deps(text) == {"/b/x.o": ["/s/x.cpp", "/s/h.h"], "z.o": ["/s/z.cpp"]}


def test_unit_key_follows_content_paths_and_fingerprint(tmp_path):
    a, b = tmp_path / "a.h", tmp_path / "b.h"
    a.write_text("1")
    b.write_text("2")
    key = oc.unit_key("fp", "u.cpp", [str(a), str(b)], oc._FileHashes())
    assert key == oc.unit_key("fp", "u.cpp", [str(b), str(a), str(a)], oc._FileHashes())
    assert key != oc.unit_key("fp2", "u.cpp", [str(a), str(b)], oc._FileHashes())
    assert key != oc.unit_key("fp", "v.cpp", [str(a), str(b)], oc._FileHashes())
    assert key != oc.unit_key("fp", "u.cpp", [str(a)], oc._FileHashes())
    a.write_text("1 changed")
    assert key != oc.unit_key("fp", "u.cpp", [str(a), str(b)], oc._FileHashes())
    assert oc.unit_key("fp", "u.cpp", [str(tmp_path / "gone.h")], oc._FileHashes()) is None


def test_unchanged_build_takes_every_unit(build):
    root, temp, config = build
    assert oc.save(config, str(temp), str(root / "cache" / "objects.tar.xz"), log=quiet) == 3
    sources, objects = oc.restore(config, str(root / "cache" / "objects.tar.xz"),
                                  str(root / "restored"), log=quiet)
    assert sources == []
    assert sorted(Path(o).read_bytes() for o in objects) == [
        b"object of csrc/a.cpp", b"object of csrc/b.cpp", b"object of csrc/c.cpp"]


def test_changed_header_recompiles_the_units_that_include_it(build):
    root, temp, config = build
    oc.save(config, str(temp), str(root / "objects.tar.xz"), log=quiet)
    (root / "csrc" / "only_b.h").write_text("// b, changed\n")
    sources, objects = oc.restore(config, str(root / "objects.tar.xz.part00"),
                                  str(root / "restored"), log=quiet)
    assert sources == ["csrc/b.cpp"]
    assert sorted(Path(o).name for o in objects) == ["a.o", "c.o"]
    (root / "csrc" / "common.h").write_text("// common, changed\n")
    sources, objects = oc.restore(config, str(root / "objects.tar.xz"), str(root / "restored"),
                                  log=quiet)
    assert sources == ["csrc/a.cpp", "csrc/b.cpp"] and [Path(o).name for o in objects] == ["c.o"]


def test_other_configuration_or_compiler_takes_nothing(build, monkeypatch):
    root, temp, config = build
    oc.save(config, str(temp), str(root / "objects.tar.xz"), log=quiet)
    flags = FakeConfig(sources=config.sources, cxx_flags=["-O2"])
    assert oc.restore(flags, str(root / "objects.tar.xz"), str(root / "r"), log=quiet) == (
        config.sources, [])
    monkeypatch.setattr(oc, "_tool_version", lambda command: "fake compiler 2.0")
    assert oc.restore(config, str(root / "objects.tar.xz"), str(root / "r"), log=quiet) == (
        config.sources, [])


def test_missing_or_broken_cache_compiles_everything(build):
    root, temp, config = build
    logged = []
    assert oc.restore(config, str(root / "none.tar.xz"), str(root / "r"), log=logged.append) == (
        config.sources, [])
    (root / "broken.tar.xz.part00").write_bytes(b"not an archive")
    assert oc.restore(config, str(root / "broken.tar.xz"), str(root / "r"),
                      log=logged.append) == (config.sources, [])
    assert "none at" in logged[0] and "unreadable" in logged[1], logged


def test_parts_split_and_join(build, monkeypatch):
    root, temp, config = build
    monkeypatch.setattr(oc, "PART_BYTES", 64)
    oc.save(config, str(temp), str(root / "objects.tar.xz"), log=quiet)
    parts = sorted(root.glob("objects.tar.xz.part*"))
    assert len(parts) > 2 and all(p.stat().st_size <= 64 for p in parts)
    data = b"".join(p.read_bytes() for p in parts)
    manifest = json.load(tarfile.open(fileobj=io.BytesIO(data), mode="r:xz").extractfile(
        oc.MANIFEST))
    assert sorted(manifest["units"]) == config.sources
    # a second save replaces the old parts instead of leaving stale ones behind
    monkeypatch.setattr(oc, "PART_BYTES", 1 << 20)
    oc.save(config, str(temp), str(root / "objects.tar.xz"), log=quiet)
    assert [p.name for p in root.glob("objects.tar.xz.part*")] == ["objects.tar.xz.part00"]


def test_save_keeps_the_units_a_build_took_from_the_cache(build):
    """A build that compiled one unit and linked two from the cache saves all three, so the
    cache carries over to the next change."""
    root, temp, config = build
    oc.save(config, str(temp), str(root / "first.tar.xz"), log=quiet)
    (root / "csrc" / "c.cpp").write_text("// c, changed\n")
    sources, _ = oc.restore(config, str(root / "first.tar.xz"), str(root / "restored"),
                            log=quiet)
    assert sources == ["csrc/c.cpp"]
    for unit in ("a", "b"):  # the fresh build folder holds only what it compiled
        (temp / "csrc" / f"{unit}.o").unlink()
    (temp / "csrc" / "c.o").write_bytes(b"object of the new csrc/c.cpp")
    assert oc.save(config, str(temp), str(root / "second.tar.xz"), str(root / "restored"),
                   log=quiet) == 3
    sources, objects = oc.restore(config, str(root / "second.tar.xz"), str(root / "again"),
                                  log=quiet)
    assert sources == []
    assert b"object of the new csrc/c.cpp" in [Path(o).read_bytes() for o in objects]


def test_save_leaves_out_a_unit_whose_file_changed_after_the_build(build):
    """An edit after the build (the file newer than the object) would otherwise key the old
    object to the new content."""
    import os
    root, temp, config = build
    later = (temp / "csrc" / "a.o").stat().st_mtime + 10
    os.utime(root / "csrc" / "common.h", (later, later))
    assert oc.save(config, str(temp), str(root / "objects.tar.xz"), log=quiet) == 1
    sources, _ = oc.restore(config, str(root / "objects.tar.xz"), str(root / "r"), log=quiet)
    assert sources == ["csrc/a.cpp", "csrc/b.cpp"]
