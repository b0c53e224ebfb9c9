"""scripts/prebuilt_extension.py: a built extension packed into one xz file and unpacked again,
byte for byte, with its MD5; bad arguments and a damaged pack leave nothing behind."""

from __future__ import annotations

import hashlib
import importlib.util
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "prebuilt_extension.py"
spec = importlib.util.spec_from_file_location("prebuilt_extension", SCRIPT)
pe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pe)


def test_pack_then_unpack_restores_the_extension(tmp_path):
    so = tmp_path / "_C.abi3.so"
    data = os.urandom(300_000) + bytes(2_000_000)  # incompressible and compressible parts
    so.write_bytes(data)
    digest = hashlib.md5(data).hexdigest()
    xz = tmp_path / "_C.abi3.so.xz"
    assert pe.pack(so, xz) == digest
    assert 0 < xz.stat().st_size < len(data) // 2
    restored = tmp_path / "restored.so"
    assert pe.unpack(xz, restored) == digest and restored.read_bytes() == data
    assert not (tmp_path / "restored.so.partial").exists()


def test_damaged_pack_leaves_no_extension(tmp_path):
    xz = tmp_path / "bad.xz"
    xz.write_bytes(lzma.compress(b"x" * 1000)[:20])  # truncated
    so = tmp_path / "_C.abi3.so"
    with pytest.raises((lzma.LZMAError, EOFError)):
        pe.unpack(xz, so)
    assert not so.exists() and not (tmp_path / "_C.abi3.so.partial").exists()


def test_command_line(tmp_path):
    so = tmp_path / "a.so"
    so.write_bytes(b"abc" * 1000)
    run = lambda *a: subprocess.run([sys.executable, str(SCRIPT), *a], capture_output=True,  # noqa: E731
                                    text=True, check=False)
    done = run("pack", str(so), str(tmp_path / "a.xz"))
    assert done.returncode == 0 and hashlib.md5(b"abc" * 1000).hexdigest() in done.stdout
    assert run("unpack", str(tmp_path / "a.xz"), str(tmp_path / "b.so")).returncode == 0
    assert (tmp_path / "b.so").read_bytes() == so.read_bytes()
    assert run("pack", str(tmp_path / "missing.so"), str(tmp_path / "c.xz")).returncode == 1
    assert run("squash", "x", "y").returncode == 2
