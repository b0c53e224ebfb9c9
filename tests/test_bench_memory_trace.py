"""The model benchmark's memory trace (cutlass_nn/bench/memory_trace.py) on snapshot-shaped
dicts: block addresses, allocation sites, kept / freed blocks and the sides' difference."""

from __future__ import annotations

import pytest
import torch

from cutlass_nn.bench import memory_trace as mt


def _frame(path, line, name):
    return {"filename": path, "line": line, "name": name}


CONVERT = [_frame("/x/torch/utils/_contextlib.py", 1, "wrapper"),
           _frame("/repo/cutlass_nn/ops.py", 42, "linear"),
           _frame("/repo/cutlass_nn/modules.py", 7, "forward"),
           _frame("??", 0, "at::native::empty"),  # a C++ frame: not a Python file
           _frame("/repo/cutlass_nn/bench/models.py", 99, "step")]


def _snapshot(*segments):
    """segments: (address, [(size, state, frames), ...])"""
    return {"segments": [
        {"address": addr, "blocks": [{"size": s, "state": st, "frames": fr} for s, st, fr in blocks]}
        for addr, blocks in segments
    ]}


def test_origin_keeps_the_innermost_python_frames_of_the_caller():
    assert mt.origin(CONVERT, depth=2) == "cutlass_nn/ops.py:42:linear < cutlass_nn/modules.py:7:forward"
    assert mt.origin(CONVERT) == ("cutlass_nn/ops.py:42:linear < cutlass_nn/modules.py:7:forward"
                                  " < bench/models.py:99:step")
    assert mt.origin([]) == "(no stack)"


def test_live_blocks_addresses_follow_the_segment_layout():
    snap = _snapshot((1000, [(512, "active_allocated", CONVERT), (2048, "inactive", []),
                             (1024, "active_allocated", [])]))
    assert mt.live_blocks(snap) == {(1000, 512, 512, mt.origin(CONVERT)),
                                    (3560, 1024, 1024, "(no stack)")}
    snap["segments"][0]["blocks"][2]["address"] = 9000  # a block's own address wins
    assert (9000, 1024, 1024, "(no stack)") in mt.live_blocks(snap)
    snap["segments"][0]["blocks"][2]["requested_size"] = 1000  # what the tensor asked for
    assert (9000, 1024, 1000, "(no stack)") in mt.live_blocks(snap)


def test_a_block_reallocated_in_place_by_another_site_counts_as_freed_and_kept():
    before = _snapshot((0, [(1048576, "active_allocated", CONVERT[4:])]))
    after = _snapshot((0, [(1048576, "active_allocated", CONVERT)]))
    c = mt.compare(before, after)
    assert c["kept_bytes"] == c["freed_bytes"] == 1048576
    assert c["kept"][0]["origin"] == mt.origin(CONVERT)
    assert c["freed"][0]["origin"] == "bench/models.py:99:step"
    assert mt.compare(after, after)["kept"] == []


def test_compare_reports_kept_and_freed_blocks_by_origin():
    before = _snapshot((0, [(512, "active_allocated", []), (512, "active_allocated", [])]))
    # the second block is freed; two new blocks from one site and one from another are kept
    after = _snapshot((0, [(512, "active_allocated", []), (512, "inactive", [])]),
                      (4096, [(2048, "active_allocated", CONVERT), (1024, "active_allocated", CONVERT),
                              (8192, "active_allocated", CONVERT[4:])]))
    c = mt.compare(before, after)
    assert c["kept_bytes"] == 2048 + 1024 + 8192 and c["freed_bytes"] == 512
    assert c["kept_requested_bytes"] == c["kept_bytes"]  # no requested sizes: the block sizes
    assert c["kept"][0] == {"origin": "bench/models.py:99:step", "bytes": 8192,
                            "requested_bytes": 8192, "blocks": 1}
    assert c["kept"][1] == {"origin": mt.origin(CONVERT), "bytes": 3072,
                            "requested_bytes": 3072, "blocks": 2}
    assert c["freed"] == [{"origin": "(no stack)", "bytes": 512, "requested_bytes": 512,
                           "blocks": 1}]


def test_compare_sums_requested_sizes_apart_from_block_sizes():
    """A tensor of 3 MiB - 512 B in a 4 MiB block that the allocator did not split: the block
    counts 4 MiB, the request 3 MiB - 512 B."""
    after = _snapshot((0, [(4 << 20, "active_allocated", CONVERT)]))
    after["segments"][0]["blocks"][0]["requested_size"] = (3 << 20) - 512
    c = mt.compare(_snapshot(), after)
    assert c["kept_bytes"] == 4 << 20 and c["kept_requested_bytes"] == (3 << 20) - 512
    assert c["kept"][0]["requested_bytes"] == (3 << 20) - 512 and c["freed_requested_bytes"] == 0


def test_format_difference_names_only_the_origins_that_differ():
    same = {"origin": "a.py:1:f", "bytes": 4096, "blocks": 1}
    stock = {"kept": [same], "freed": []}
    ours = {"kept": [same, {"origin": "b.py:2:g", "bytes": 1048576, "blocks": 1}],
            "freed": [{"origin": "c.py:3:h", "bytes": 512, "blocks": 1}]}
    lines = mt.format_difference({"stock": stock, "cutlass_nn": ours})
    assert lines == ["  +0 / +1048576 bytes, requested +0 / +1048576 (stock / cutlass_nn): b.py:2:g",
                     "  +0 / -512 bytes, requested +0 / -512 (stock / cutlass_nn): c.py:3:h"]
    assert mt.format_difference({"stock": stock, "cutlass_nn": None}) == []
    # the difference is over every origin: one that is not among the largest still counts
    many = [{"origin": f"s{i}.py:1:f", "bytes": 10_000 - i, "blocks": 1} for i in range(60)]
    lines = mt.format_difference({"stock": {"kept": many, "freed": []},
                                  "cutlass_nn": {"kept": many[:-1], "freed": []}})
    assert lines == ["  +9941 / +0 bytes, requested +9941 / +0 (stock / cutlass_nn): s59.py:1:f"]
    # equal requests in blocks of different sizes (the allocator's rounding), and equal blocks
    # holding different requests, are both named
    rounded = {"origin": "adam.py:178:_init_group", "bytes": 3 << 20, "requested_bytes": 2 << 20,
               "blocks": 1}
    exact = dict(rounded, bytes=2 << 20)
    lines = mt.format_difference({"stock": {"kept": [exact], "freed": []},
                                  "cutlass_nn": {"kept": [rounded], "freed": []}})
    assert lines == ["  +2097152 / +3145728 bytes, requested +2097152 / +2097152 (stock / cutlass_nn):"
                     " adam.py:178:_init_group"]
    other = dict(exact, requested_bytes=(2 << 20) - 512)
    assert mt.format_difference({"stock": {"kept": [exact], "freed": []},
                                 "cutlass_nn": {"kept": [other], "freed": []}}) == [
        "  +2097152 / +2097152 bytes, requested +2097152 / +2096640 (stock / cutlass_nn):"
        " adam.py:178:_init_group"]


def test_recording_and_side_trace(monkeypatch):
    """On CUDA, recording keeps the live blocks' Python stacks (state only, no event trace) and
    turns that off on the way out, also after an error; a side's trace compares the snapshots
    at its two ends. Off CUDA neither touches the allocator."""
    calls = []
    snaps = iter([_snapshot(), _snapshot((0, [(1024, "active_allocated", CONVERT)]))])

    def record(*args, **kwargs):
        calls.append((args, kwargs))

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: next(snaps))
    with mt.recording("cuda"):
        result = mt.SideMemoryTrace("cuda").finish()
    assert calls == [((), {"enabled": "state", "stacks": "python"}), ((), {"enabled": None})]
    assert result["kept_bytes"] == 1024 and result["kept"][0]["origin"] == mt.origin(CONVERT)
    calls.clear()
    with pytest.raises(RuntimeError), mt.recording("cuda"):
        raise RuntimeError("a side failed to build")
    assert calls[-1] == ((), {"enabled": None})
    calls.clear()
    with mt.recording("cpu"):
        assert mt.SideMemoryTrace("cpu").finish() is None
    assert calls == []
