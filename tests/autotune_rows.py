"""A valid row of an autotune table file (cutlass_nn.autotune's JSON), for tests that write
such files; keyword arguments override its fields."""

from __future__ import annotations


def tuned_row(**overrides) -> dict:
    row = {
        "device_name": "no such GPU", "multiprocessors": 7, "m": 4096, "n": 256, "k": 1024,
        "layout_a": "row", "layout_b": "col", "dtype": "bfloat16", "out_dtype": "bfloat16",
        "bias": True, "accumulate": False, "config": 6, "swizzle": 0, "splits": 0,
        "transposed": True, "rule_config": 7, "rule_swizzle": 0, "rule_splits": 0,
        "rule_transposed": True, "candidates": 12, "best_us": 10.5, "rule_us": 12.0,
    }  # fmt: skip
    row.update(overrides)
    return row
