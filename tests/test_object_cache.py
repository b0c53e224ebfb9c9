"""cutlass_nn/_object_cache.py: the content-keyed cache of compiled objects that lets a build on
a fresh machine compile only the units whose inputs changed, and never links an object whose
inputs differ from what it was compiled from. No compiler runs here: small files stand in for
sources, headers and objects, and ninja's dependency log is given as text."""

from __future__ import annotations

import importlib.util
import io
import json
import os
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


UNITS = {"csrc/a.cpp": ["common.h"], "csrc/b.cpp": ["common.h", "only_b.h"], "csrc/c.cpp": []}
#: a header outside the checkout's csrc/ (a toolkit's), read by b.cpp
EXTERNAL = "toolkit/include/gemm.h"


class Checkout:
    """A checkout-shaped folder: csrc/ with three units over two headers, a build folder whose
    objects a "compiler" writes, and ninja's dependency log of that build."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.temp = root / "build" / "temp"
        self.record = str(root / "build" / "object_cache_run.json")
        self.restored = str(root / "build" / "object_cache")
        self.config = FakeConfig(sources=list(UNITS))
        (root / "csrc").mkdir()
        (root / "csrc" / "common.h").write_text("// common\n")
        (root / "csrc" / "only_b.h").write_text("// b\n")
        (root / EXTERNAL).parent.mkdir(parents=True)
        (root / EXTERNAL).write_text("// gemm v1\n")
        for source in UNITS:
            (root / source).write_text(f"// {source}\n")

    def inputs(self, source: str) -> list[str]:
        external = [str(self.root / EXTERNAL)] if source == "csrc/b.cpp" else []
        return ([str(self.root / source)] + [str(self.root / "csrc" / h) for h in UNITS[source]]
                + external)

    def begin(self) -> str:
        return oc.begin_build(self.config, record=self.record, log=quiet)

    def compile(self, sources=None, tag: str = "") -> None:
        """Writes the objects of ``sources`` (all) as a build would, now."""
        for source in sources or UNITS:
            obj = self.temp / oc.object_name(source)
            obj.parent.mkdir(parents=True, exist_ok=True)
            obj.write_bytes(f"object of {source}{tag}".encode())

    def ninja_log(self) -> str:
        lines = []
        for source in UNITS:
            inputs = self.inputs(source)
            lines.append(f"{self.temp / oc.object_name(source)}: #deps {len(inputs)}, deps mtime 1 (VALID)")
            lines += [f"    {i}" for i in inputs] + [""]
        return "\n".join(lines)

    def save(self, archive: str, restored: str | None = None, previous: str | None = None) -> int:
        return oc.save(str(self.temp), str(self.root / archive), restored, self.record, log=quiet,
                       previous=str(self.root / previous) if previous else None)

    def copy_afresh(self) -> None:
        """What the GPU machine does to the checkout before each call: every file written
        again with the same content, so its status-change time is later than the objects of
        the call before (whose times, and the run's start, are set back a minute here, as if
        that call had run then)."""
        earlier = os.stat(self.record).st_mtime - 60
        with open(self.record) as f:
            run = json.load(f)
        run["start"] = earlier
        with open(self.record, "w") as f:
            json.dump(run, f)
        os.utime(self.record, (earlier, earlier))
        for obj in self.temp.rglob("*.o"):
            os.utime(obj, (earlier + 30, earlier + 30))
        for path in sorted((self.root / "csrc").rglob("*")) + [self.root / EXTERNAL]:
            if path.is_file():
                path.write_bytes(path.read_bytes())

    def restore(self, archive: str, print_: str | None = None):
        print_ = print_ or oc.fingerprint(self.config)
        return oc.restore(self.config, str(self.root / archive), print_, self.restored, log=quiet)


def quiet(msg: str) -> None:
    pass


@pytest.fixture()
def checkout(tmp_path, monkeypatch):
    co = Checkout(tmp_path)
    monkeypatch.setattr(oc, "ROOT", str(tmp_path))
    monkeypatch.setattr(oc, "CSRC", str(tmp_path / "csrc"))
    monkeypatch.setattr(oc, "_ninja_deps", lambda build_temp: {
        os.path.abspath(o): d for o, d in oc.parse_ninja_deps(co.ninja_log()).items()})
    monkeypatch.setattr(oc, "_tool_version", lambda command: "fake compiler 1.0")
    return co


def objects_of(objects) -> list[bytes]:
    return sorted(Path(o).read_bytes() for o in objects)


def test_parse_ninja_deps_keeps_valid_records_only():
    text = ("/b/x.o: #deps 2, deps mtime 5 (VALID)\n    /s/x.cpp\n    /s/h.h\n\n"
            "/b/y.o: #deps 1, deps mtime 5 (STALE)\n    /s/y.cpp\n\n"
            "z.o: #deps 1, deps mtime 7 (VALID)\n    /s/z.cpp\n")
    assert oc.parse_ninja_deps(text) == {"/b/x.o": ["/s/x.cpp", "/s/h.h"], "z.o": ["/s/z.cpp"]}


def test_unit_key_follows_content_paths_namesakes_and_fingerprint(checkout):
    root = checkout.root
    a, b = str(root / "csrc" / "common.h"), str(root / "csrc" / "only_b.h")

    def key(print_="fp", source="csrc/b.cpp", deps=(a, b)):
        return oc.unit_key(print_, source, deps, oc._FileHashes())

    first = key()
    assert first == key(deps=(b, a, a))
    assert first != key(print_="fp2") and first != key(source="csrc/a.cpp")
    assert first != key(deps=(a,))
    (root / "csrc" / "common.h").write_text("// common, changed\n")
    second = key()
    assert second != first
    # a new file of the same name elsewhere under csrc/ could be what an include finds now
    (root / "csrc" / "sub").mkdir()
    (root / "csrc" / "sub" / "common.h").write_text("// shadows\n")
    shadowed = key()
    assert shadowed != second
    # the unit's own source counts even where the dependency log leaves it out (deps a, b only)
    (root / "csrc" / "b.cpp").write_text("// b, changed\n")
    assert key() != shadowed
    assert key(deps=(str(root / "gone.h"),)) is None


def test_fingerprint_covers_checkout_environment_and_debug(checkout, monkeypatch):
    base = oc.fingerprint(checkout.config)
    assert base != oc.fingerprint(checkout.config, debug=True)
    assert base != oc.fingerprint(checkout.config, cuda_home="/usr/local/cuda")
    assert base != oc.fingerprint(FakeConfig(sources=checkout.config.sources, cxx_flags=["-O2"]))
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-G")
    assert base != oc.fingerprint(checkout.config)
    monkeypatch.delenv("NVCC_APPEND_FLAGS")
    monkeypatch.setattr(oc, "ROOT", "/elsewhere")  # another checkout of the same files
    assert base != oc.fingerprint(checkout.config)


def test_unchanged_build_takes_every_unit_but_one(checkout):
    """Everything cached: all but the cheapest unit are linked (torch's build needs a source)."""
    print_ = checkout.begin()
    checkout.compile()
    assert checkout.save("cache/objects.tar.xz") == 3
    sources, objects = checkout.restore("cache/objects.tar.xz", print_)
    assert len(sources) == 1 and len(objects) == 2
    assert objects_of(objects) == sorted(
        f"object of {s}".encode() for s in UNITS if s not in sources)


def test_changed_header_recompiles_the_units_that_include_it(checkout):
    print_ = checkout.begin()
    checkout.compile()
    checkout.save("objects.tar.xz")
    (checkout.root / "csrc" / "only_b.h").write_text("// b, changed\n")
    sources, objects = checkout.restore("objects.tar.xz.part00", print_)
    assert sources == ["csrc/b.cpp"]
    assert sorted(Path(o).name for o in objects) == ["a.o", "c.o"]
    (checkout.root / "csrc" / "common.h").write_text("// common, changed\n")
    sources, objects = checkout.restore("objects.tar.xz", print_)
    assert sources == ["csrc/a.cpp", "csrc/b.cpp"] and [Path(o).name for o in objects] == ["c.o"]


def test_other_configuration_compiler_or_checkout_takes_nothing(checkout, monkeypatch):
    checkout.begin()
    checkout.compile()
    checkout.save("objects.tar.xz")
    other = oc.fingerprint(FakeConfig(sources=checkout.config.sources, cxx_flags=["-O2"]))
    assert checkout.restore("objects.tar.xz", other) == (checkout.config.sources, [])
    monkeypatch.setattr(oc, "_tool_version", lambda command: "fake compiler 2.0")
    assert checkout.restore("objects.tar.xz") == (checkout.config.sources, [])


def test_missing_truncated_or_broken_cache_compiles_everything(checkout):
    print_ = checkout.begin()
    checkout.compile()
    checkout.save("good.tar.xz")
    logged = []

    def restore(name):
        return oc.restore(checkout.config, str(checkout.root / name), print_, checkout.restored,
                          log=logged.append)

    everything = (checkout.config.sources, [])
    assert restore("none.tar.xz") == everything
    (checkout.root / "broken.tar.xz.part00").write_bytes(b"not an archive")
    assert restore("broken.tar.xz") == everything
    data = (checkout.root / "good.tar.xz.part00").read_bytes()
    (checkout.root / "cut.tar.xz.part00").write_bytes(data[: len(data) // 2])
    assert restore("cut.tar.xz") == everything
    (checkout.root / "gap.tar.xz.part00").write_bytes(data)
    (checkout.root / "gap.tar.xz.part02").write_bytes(b"")
    assert restore("gap.tar.xz") == everything
    assert "none at" in logged[0] and all("unusable" in m for m in logged[1:]), logged
    assert not Path(checkout.restored).exists()


def test_parts_split_join_and_replace(checkout, monkeypatch):
    checkout.begin()
    checkout.compile()
    monkeypatch.setattr(oc, "PART_BYTES", 64)
    checkout.save("objects.tar.xz")
    parts = sorted(checkout.root.glob("objects.tar.xz.part*"))
    assert len(parts) > 2 and all(p.stat().st_size <= 64 for p in parts)
    data = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        manifest = json.load(tar.extractfile(oc.MANIFEST))
    assert sorted(manifest["units"]) == checkout.config.sources
    monkeypatch.setattr(oc, "PART_BYTES", 1 << 20)
    checkout.save("objects.tar.xz")
    assert [p.name for p in checkout.root.glob("objects.tar.xz*")] == ["objects.tar.xz.part00"]


def test_save_keeps_the_units_a_build_took_from_the_cache(checkout):
    """A build that compiled one unit and linked two from the cache saves all three, so the
    cache carries over to the next change."""
    print_ = checkout.begin()
    checkout.compile()
    checkout.save("first.tar.xz")
    (checkout.root / "csrc" / "c.cpp").write_text("// c, changed\n")
    # a fresh machine: a new build folder and run record, then the build
    os.remove(checkout.record)
    for source in UNITS:
        (checkout.temp / oc.object_name(source)).unlink()
    print_ = checkout.begin()
    sources, _ = checkout.restore("first.tar.xz", print_)
    assert sources == ["csrc/c.cpp"]
    checkout.compile(sources, tag=" (new)")
    assert checkout.save("second.tar.xz", checkout.restored) == 3
    (checkout.root / "csrc" / "a.cpp").write_text("// a, changed\n")
    sources, objects = checkout.restore("second.tar.xz", print_)
    assert sources == ["csrc/a.cpp"]
    assert b"object of csrc/c.cpp (new)" in objects_of(objects)


def test_save_leaves_out_objects_this_build_did_not_make(checkout):
    """An object older than the run record (ninja kept it: an edit that preserved an old
    modification time) is not keyed to the files as they are now."""
    checkout.compile()  # before the run began
    later = (checkout.temp / "csrc" / "a.o").stat().st_mtime + 5
    checkout.begin()
    with open(checkout.record) as f:
        run = json.load(f)
    run["start"] = later
    with open(checkout.record, "w") as f:
        json.dump(run, f)
    assert checkout.save("objects.tar.xz") == 0


def test_save_leaves_out_units_whose_files_changed_during_or_after_the_build(checkout):
    checkout.begin()
    checkout.compile()
    # an edit that kept the old modification time: only the content shows it
    header = checkout.root / "csrc" / "only_b.h"
    stat = header.stat()
    header.write_text("// b, edited during the build\n")
    os.utime(header, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    # an edit after the build, with a newer time
    source = checkout.root / "csrc" / "c.cpp"
    source.write_text("// c, edited after\n")
    later = (checkout.temp / "csrc" / "c.o").stat().st_mtime + 5
    os.utime(source, (later, later))
    assert checkout.save("objects.tar.xz") == 1
    sources, _ = checkout.restore("objects.tar.xz")
    assert "csrc/a.cpp" not in sources


def test_a_resumed_build_keeps_its_first_run_record(checkout):
    """The GPU machine's build runs over two setup.py calls in one build folder: the second
    keeps the first's start, so the objects of the first call are saved too."""
    checkout.begin()
    with open(checkout.record) as f:
        first = json.load(f)["start"]
    checkout.compile()
    checkout.begin()
    with open(checkout.record) as f:
        assert json.load(f)["start"] == first
    assert checkout.save("objects.tar.xz") == 3


def test_save_leaves_out_a_unit_whose_external_header_was_replaced_with_an_old_time(checkout):
    """A toolkit header re-extracted from an archive keeps its archived modification time; its
    status-change time shows the change."""
    checkout.begin()
    checkout.compile()
    header = checkout.root / EXTERNAL
    old = header.stat()
    header.write_text("// gemm v2\n")
    os.utime(header, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert checkout.save("objects.tar.xz") == 2
    sources, _ = checkout.restore("objects.tar.xz")
    assert "csrc/b.cpp" in sources


def test_save_rechecks_the_units_it_carries_from_the_cache(checkout):
    print_ = checkout.begin()
    checkout.compile()
    checkout.save("first.tar.xz")
    os.remove(checkout.record)
    for source in UNITS:
        (checkout.temp / oc.object_name(source)).unlink()
    print_ = checkout.begin()
    checkout.restore("first.tar.xz", print_)
    # changed between the restore and the save: the carried entry no longer matches
    (checkout.root / "csrc" / "only_b.h").write_text("// b, changed after the restore\n")
    checkout.compile(["csrc/c.cpp"])  # what this build compiled (c.cpp went back to compile)
    saved = checkout.save("second.tar.xz", checkout.restored)
    with tarfile.open(checkout.root / "second.tar.xz.part00", mode="r:xz") as tar:
        units = json.load(tar.extractfile(oc.MANIFEST))["units"]
    assert "csrc/b.cpp" not in units and saved == len(units)


def test_restore_empties_its_folder_first(checkout):
    print_ = checkout.begin()
    checkout.compile()
    checkout.save("objects.tar.xz")
    stale = Path(checkout.restored) / "csrc" / "stale.o"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"from an older build")
    checkout.restore("objects.tar.xz", print_)
    assert not stale.exists()


def test_save_leaves_out_a_unit_whose_checkout_file_differs_from_the_run_record(checkout):
    """Edited after the run began, even before its compile: the record's content is what the
    key would otherwise claim."""
    checkout.begin()
    (checkout.root / "csrc" / "c.cpp").write_text("// c, edited after the run began\n")
    checkout.compile()
    assert checkout.save("objects.tar.xz") == 2


def test_a_build_over_two_calls_is_saved_whole_with_the_earlier_save(checkout):
    """The GPU machine copies the checkout afresh into each call: the objects of the first call
    are then older than their inputs' times and left out of a save in the second call, unless
    it carries the first call's own save, whose keys still match the (unchanged) content."""
    checkout.begin()
    checkout.compile(["csrc/a.cpp", "csrc/b.cpp"])  # call 1, stopped by its time limit
    assert checkout.save("call1.tar.xz") == 2
    checkout.copy_afresh()
    checkout.begin()  # call 2 resumes the build in the same folder
    checkout.compile(["csrc/c.cpp"])
    assert checkout.save("alone.tar.xz") == 1
    assert checkout.save("whole.tar.xz", previous="call1.tar.xz") == 3
    sources, objects = checkout.restore("whole.tar.xz")
    assert len(sources) == 1 and len(objects) == 2


def test_the_earlier_save_is_carried_only_where_its_keys_still_match(checkout):
    checkout.begin()
    checkout.compile(["csrc/a.cpp", "csrc/b.cpp"])
    checkout.save("call1.tar.xz")
    checkout.copy_afresh()
    # changed between the calls (the checkout carried into call 2 differs): b's key is stale
    (checkout.root / "csrc" / "only_b.h").write_text("// b, changed between the calls\n")
    checkout.begin()
    checkout.compile(["csrc/c.cpp"])
    assert checkout.save("whole.tar.xz", previous="call1.tar.xz") == 2
    sources, _ = checkout.restore("whole.tar.xz")
    assert "csrc/b.cpp" in sources and "csrc/a.cpp" not in sources


def test_an_earlier_save_of_another_build_or_none_carries_nothing(checkout, monkeypatch):
    checkout.begin()
    checkout.compile(["csrc/a.cpp", "csrc/b.cpp"])
    checkout.save("call1.tar.xz")
    checkout.copy_afresh()
    # missing, broken, and of another configuration: the save goes on with what it compiled
    assert checkout.save("s1.tar.xz", previous="nothing.tar.xz") == 0
    (checkout.root / "broken.tar.xz").write_bytes(b"not an archive")
    assert checkout.save("s2.tar.xz", previous="broken.tar.xz") == 0
    os.remove(checkout.record)
    checkout.config.cxx_flags = ["-O2"]
    checkout.begin()
    checkout.compile(["csrc/c.cpp"])
    assert checkout.save("s3.tar.xz", previous="call1.tar.xz") == 1


def test_save_command_line_takes_the_earlier_save(checkout, monkeypatch):
    seen = {}
    monkeypatch.setattr(oc, "save", lambda temp, archive, restored, previous=None:
                        seen.update(temp=temp, archive=archive, restored=restored,
                                    previous=previous) or 1)
    assert oc.main(["save", "bt", "out.tar.xz", "--previous", "early.tar.xz"]) == 0
    assert seen == {"temp": "bt", "archive": "out.tar.xz", "restored": oc.RESTORED_DIR,
                    "previous": "early.tar.xz"}
    assert oc.main(["save", "bt", "out.tar.xz", "rd"]) == 0 and seen["previous"] is None
    assert oc.main(["save", "bt", "out.tar.xz", "--previous"]) == 2


@pytest.mark.parametrize("tool", [True, False], ids=["xz-tool", "python-lzma"])
def test_the_archive_reads_back_with_or_without_the_xz_tool(checkout, monkeypatch, tool):
    """Compressed by the xz tool on all cores where it is found, else by Python's lzma: either
    way restore reads it and links every unit but one."""
    import shutil as _shutil
    found = _shutil.which("xz")
    if tool and found is None:
        pytest.skip("no xz tool on this machine")
    real_which = _shutil.which
    monkeypatch.setattr(oc.shutil, "which",
                        lambda name: (found if tool else None) if name == "xz" else real_which(name))
    print_ = checkout.begin()
    checkout.compile()
    assert checkout.save("objects.tar.xz") == 3
    sources, objects = checkout.restore("objects.tar.xz", print_)
    assert len(sources) == 1 and len(objects) == 2


def test_the_earlier_save_supplies_its_own_objects(checkout):
    """What is carried is the earlier save's object, not whatever the build folder holds under
    that name now (an object older than the run, which this build did not make)."""
    checkout.begin()
    checkout.compile(["csrc/a.cpp", "csrc/b.cpp"], tag=" (call 1)")
    checkout.save("call1.tar.xz")
    checkout.copy_afresh()
    obj = checkout.temp / oc.object_name("csrc/b.cpp")
    stat = obj.stat()
    obj.write_bytes(b"something else")
    os.utime(obj, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    checkout.begin()
    checkout.compile(["csrc/c.cpp"])
    assert checkout.save("whole.tar.xz", previous="call1.tar.xz") == 3
    _, objects = checkout.restore("whole.tar.xz")  # every unit but the smallest, a.cpp
    assert b"object of csrc/b.cpp (call 1)" in objects_of(objects)
    assert b"something else" not in objects_of(objects)


def test_the_earlier_save_carries_only_this_builds_sources(checkout):
    checkout.begin()
    checkout.compile(["csrc/a.cpp", "csrc/b.cpp"])
    checkout.save("call1.tar.xz")
    checkout.copy_afresh()
    # a build of the same configuration without b.cpp (a source removed)
    os.remove(checkout.record)
    checkout.config.sources = ["csrc/a.cpp", "csrc/c.cpp"]
    checkout.begin()
    checkout.compile(["csrc/c.cpp"])
    assert checkout.save("whole.tar.xz", previous="call1.tar.xz") == 2
    with tarfile.open(checkout.root / "whole.tar.xz.part00", mode="r:xz") as tar:
        assert set(json.load(tar.extractfile(oc.MANIFEST))["units"]) == {"csrc/a.cpp", "csrc/c.cpp"}


def test_an_object_rewritten_while_it_is_saved_is_left_out(checkout, monkeypatch):
    """A compiler that outlived a stopped build may still write an object the save is reading:
    the save keeps an object only if its time and size did not change while it was copied."""
    checkout.begin()
    checkout.compile()
    victim = checkout.temp / oc.object_name("csrc/b.cpp")
    real_copy = oc.shutil.copyfile

    def copy_while_written(src, dst, *args, **kwargs):
        result = real_copy(src, dst, *args, **kwargs)
        if Path(src) == victim:
            victim.write_bytes(b"object of csrc/b.cpp, half written and more")
        return result

    monkeypatch.setattr(oc.shutil, "copyfile", copy_while_written)
    assert checkout.save("objects.tar.xz") == 2
    sources, _ = checkout.restore("objects.tar.xz")
    assert "csrc/b.cpp" in sources


def test_the_xz_tool_compresses_where_it_is_found(checkout, monkeypatch):
    calls = []
    real_run = oc.subprocess.run

    def run(cmd, *args, **kwargs):
        calls.append(cmd[0])
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(oc.subprocess, "run", run)
    found = oc.shutil.which("xz")
    checkout.begin()
    checkout.compile()
    checkout.save("objects.tar.xz")
    assert (found in calls) if found else (not any("xz" in c for c in calls))
