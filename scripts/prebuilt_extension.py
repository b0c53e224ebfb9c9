"""Packs a built extension (``cutlass_nn/_C.abi3.so``) into one xz file and unpacks it again,
printing the MD5 of the extension either way, so that a GPU machine's build can travel back in
one file and be carried into later calls instead of being rebuilt.

The full CUDA build is about 69 MB, over what the device tool brings back from one call; xz
packs it about 5:1 (a 65.5 MB prefix of it: 12.8 MB), under the 16 MiB a returned file may
have. ``scripts/gpu_check.sh`` calls it: ``SAVE_SO=1`` packs the fresh build into
``$OUT/_C.abi3.so.xz``; ``PREBUILT_SO=path.xz`` unpacks one in place of building.

Usage: python3 scripts/prebuilt_extension.py pack SO XZ | unpack XZ SO
"""

from __future__ import annotations

import hashlib
import lzma
import shutil
import sys
from pathlib import Path

CHUNK = 1 << 20


def md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def pack(so: Path, xz: Path) -> str:
    """Writes ``xz`` (preset 6) from ``so``; returns the MD5 of ``so``."""
    with open(so, "rb") as src, lzma.open(xz, "wb", preset=6) as dst:
        shutil.copyfileobj(src, dst, CHUNK)
    return md5(so)


def unpack(xz: Path, so: Path) -> str:
    """Writes ``so`` from ``xz`` (through a temporary file, so a failed unpack leaves no partial
    extension behind); returns its MD5."""
    tmp = so.with_name(so.name + ".partial")
    try:
        with lzma.open(xz, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(so)
    return md5(so)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("pack", "unpack"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    src, dst = Path(argv[1]), Path(argv[2])
    if not src.is_file():
        print(f"prebuilt_extension {argv[0]}: no file {src}", file=sys.stderr)
        return 1
    digest = (pack if argv[0] == "pack" else unpack)(src, dst)
    print(f"prebuilt_extension {argv[0]}: {src} ({src.stat().st_size} bytes) -> {dst} "
          f"({dst.stat().st_size} bytes); md5 of the extension {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
