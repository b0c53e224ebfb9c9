"""The SM90 kernel-selection rule (csrc/kernels/gemm_dispatch.cu) without a GPU: the dispatcher
compiled with the host compiler against stub kernels (csrc/kernels/tests/rule_harness.cpp), so
that which configuration, swizzle and split each GEMM gets -- and what the fallbacks and
overrides do -- is checked on every machine with a C++ compiler and the CUDA runtime header.

The GEMMs are given as (m, n, k) of the GEMM itself: a layer (tokens T, out N, in K) runs the
forward T x N x K, the dgrad T x K x N and the wgrad N x K x T."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The harness is compiled by scripts/rule_gaps.py's build_harness (one recipe for both).
_spec = importlib.util.spec_from_file_location("rule_gaps", ROOT / "scripts" / "rule_gaps.py")
rule_gaps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rule_gaps)
SMS = 132  # H100 SXM / H200


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    if rule_gaps.host_toolchain() is None:
        pytest.skip("needs a host C++ compiler and the CUDA runtime header (CUDA_HOME)")
    return rule_gaps.build_harness(ROOT / "csrc" / "kernels",
                                   tmp_path_factory.mktemp("rule") / "rule_harness")


class Plan(NamedTuple):
    rule: tuple[int, int, int]  # config, swizzle, splits of choose_sm90_config
    config: int  # the plan's (-1: a fused epilogue left to the caller)
    swizzle: int
    splits: int
    transposed: bool
    kernel: str  # "-" when no kernel fits


# the harness's activation codes (csrc/kernels/activation_math.h's Activation)
ACTIVATION_CODES = {"relu": 1, "gelu": 2, "gelu_tanh": 3}


def plan(harness: Path, op: str, m: int, n: int, k: int, *, out_f32=False, fused=False,
         config=-1, swizzle=0, splits=0, sms=SMS, c_mode=0, without_c=True, memory_gbps=0,
         aux=False) -> Plan:
    """The harness's plan; fused: True (a bias + ReLU epilogue) or an activation name; aux: the
    fused epilogue also stores the pre-activation (linear_act_aux); c_mode 1 adds a
    row-broadcast bias, 2 beta = 1 times C; memory_gbps: the device's peak DRAM bandwidth (0:
    unknown)."""
    act = ACTIVATION_CODES[fused] if isinstance(fused, str) else int(fused)
    query = (f"{op} {m} {n} {k} {int(out_f32)} {act} {config} {swizzle} {splits} {sms} "
             f"{c_mode} {int(without_c)} {memory_gbps} {int(aux)}\n")
    out = subprocess.run([str(harness)], input=query, capture_output=True, text=True, check=True)
    rule, _, rest = out.stdout.strip().partition(" | ")
    r = tuple(int(v) for v in rule.split())
    c, s, sp, t, name = rest.split()
    return Plan(r, int(c), int(s), int(sp), t == "1", name)


# (op, GEMM m, n, k) -> (config, swizzle, splits, transposed) of the plan, on a 132-SM GPU
RULE_CASES = {
    # the transposed small-M / few-tile problem (v0.4 / v0.8)
    ("fwd", 512, 1024, 1024): (6, 0, 0, True),
    ("fwd", 2048, 256, 1024): (6, 0, 0, True),  # 64 tiles of 64x128: under a wave, transposed
    ("fwd", 4096, 768, 256): (7, 0, 0, True),  # K <= 256: the 128x192 tile does not replace it
    # small weight gradients (v0.10): whole-K 64-row ping-pong tiles
    ("wgrad", 256, 1024, 4096): (11, 0, 0, False),  # the key/value wgrad over 4096 tokens
    ("wgrad", 256, 1024, 512): (12, 0, 0, False),  # 64x32 tiles over at most 1024 tokens
    ("wgrad", 768, 768, 512): (11, 0, 0, False),
    # v0.29: 64x128 ping-pong tiles filling 7/16 to one wave replace split-K for outputs of at
    # least 512 x 768 over 1024-8192 tokens (768 x 768 over 4096: 0.86 vs 0.60 of cuBLAS)
    ("wgrad", 768, 768, 4096): (13, 2, 0, False),  # 72 tiles of 64x128
    ("wgrad", 512, 1024, 4096): (13, 2, 0, False),  # 64 tiles
    ("wgrad", 1024, 768, 2048): (13, 2, 0, False),
    ("wgrad", 768, 768, 16384): (2, 0, 3, False),  # beyond 8192 tokens: not measured, split-K
    ("wgrad", 3072, 256, 4096): (2, 0, 2, False),  # narrower than 768: not measured, split-K
    # the clause's bounds (132 SMs): 58-132 tiles of 64x128, m >= 512, n >= 768, 1025-8192 tokens
    ("wgrad", 448, 1280, 4096): (2, 0, 3, False),  # 70 tiles, but m < 512
    ("wgrad", 1024, 640, 4096): (2, 0, 3, False),  # 80 tiles, but n < 768
    ("wgrad", 512, 896, 4096): (2, 0, 4, False),  # 56 tiles: under 7/16 of a wave
    ("wgrad", 640, 768, 4096): (13, 2, 0, False),  # 60 tiles
    ("wgrad", 576, 768, 4096): (2, 0, 4, False),  # 54 tiles of 64x128 (60 of 128x64)
    ("wgrad", 512, 2048, 4096): (13, 2, 0, False),  # 128 tiles
    ("wgrad", 512, 2176, 4096): (15, 2, 0, False),  # 136 tiles: more than a wave; v0.40 one_wave
    ("wgrad", 576, 1664, 4096): (13, 1, 0, False),  # 9 x 13; a swizzle of 2 walks 10 x 14 = 140
    ("wgrad", 768, 768, 8192): (13, 2, 0, False),
    ("wgrad", 768, 768, 8256): (2, 0, 3, False),  # beyond 8192 tokens
    ("wgrad", 768, 768, 1088): (13, 2, 0, False),  # over exactly 1024 tokens config 11 comes first
    ("wgrad", 768, 768, 1024): (11, 0, 0, False),
    ("fwd", 768, 768, 4096): (2, 0, 3, False),  # not the weight gradient's layout
    ("dgrad", 768, 768, 4096): (2, 0, 3, False),
    # v0.28's one-wave test counts 64x128 tiles: sizes that are not multiples of 128 count
    # differently from v0.22's 128x64 tiles with a 1x2 cluster
    ("fwd", 1344, 704, 1024): (13, 2, 0, False),
    ("fwd", 2112, 512, 4096): (13, 1, 0, False),  # 33 x 4 = 132 64x128 tiles (one_wave: not in place of 13)
    # 16 tiles over K = 16384: batched split-K into 8 slices of 2048 (v0.42, pending its sweep)
    ("wgrad", 256, 1024, 16384): (2, 0, -8, False),
    # the 128x192 tile (v0.10); without a cluster (config 1) for the weight gradient over
    # 2048-4096 tokens (v0.30: 2816 x 1024 over 4096 tokens 0.976 vs 0.853 for stream-K)
    ("wgrad", 1024, 2816, 4096): (1, 2, 0, False),  # 120 tiles: 91% of one wave
    ("wgrad", 2816, 1024, 4096): (1, 2, 0, False),  # 132 tiles, taller than wide
    ("wgrad", 2816, 1024, 2048): (1, 2, 0, False),
    ("wgrad", 1024, 2816, 8192): (10, 0, 0, False),  # beyond 4096 tokens: as before v0.30
    ("wgrad", 2816, 1024, 8192): (2, 0, 0, False),
    ("wgrad", 2816, 1024, 4097): (2, 0, 0, False),  # just over 4096 tokens
    # v0.49 whole_waves (was (14, 2)): under 2048 tokens: the block is not reached
    ("wgrad", 2816, 1024, 2047): (19, 1, 0, False),
    # the clause is asked only inside the mid-size weight-gradient block (at most 1.4 waves of
    # 128x128 tiles): one wave of 128x192 tiles but 198 of 128x128 kept config 14 until v0.49,
    # whose whole_waves clause then takes 22 x 12 = 264 tiles of 128x96 (two whole waves)
    ("wgrad", 2816, 1152, 4096): (17, 1, 0, False),
    ("wgrad", 2432, 1152, 4096): (1, 2, 0, False),  # 19 x 6 = 114 tiles (swizzle 2: 20 x 6)
    # v0.31: from 80% of a wave (H200: 3584 x 768 over 4096 tokens 0.971 vs 0.861 for stream-K)
    ("wgrad", 2048, 1344, 4096): (1, 2, 0, False),  # 16 x 7 = 112 tiles: 84.8% of a wave
    ("wgrad", 3584, 768, 4096): (1, 2, 0, False),  # 28 x 4 = 112
    ("wgrad", 3584, 768, 2048): (1, 2, 0, False),
    ("wgrad", 3456, 768, 4096): (1, 2, 0, False),  # 27 x 4 = 108
    ("wgrad", 6784, 384, 4096): (1, 2, 0, False),  # 53 x 2 = 106: 80.3% of a wave
    ("wgrad", 1920, 1344, 4096): (2, 0, 0, False),  # 15 x 7 = 105: 79.5%, stream-K as before
    ("wgrad", 3328, 768, 4096): (2, 0, 0, False),  # 26 x 4 = 104
    # no taller than wide, 108 tiles plain but 120 with config 10's 2x1 cluster (9 rows of tiles
    # round up to 10): config 10 before v0.31, config 1 now (even with config 10 at 1024 x 2816,
    # H100, 0.962 / 0.962; not measured in the 80-85% band for such outputs)
    ("wgrad", 1152, 2304, 4096): (1, 2, 0, False),
    ("wgrad", 1664, 1728, 4096): (1, 1, 0, False),  # 13 x 9 = 117; a swizzle of 2 walks 14 x 10
    ("wgrad", 2304, 768, 4096): (15, 2, 0, False),  # 108 tiles of 128x128: v0.40 one_wave
    # v0.49 whole_waves (was (14, 2)): not the weight gradient's layout
    ("fwd", 2816, 1024, 4096): (19, 1, 0, False),
    ("dgrad", 2816, 1024, 4096): (19, 1, 0, False),  # v0.49 whole_waves (was (14, 2))
    ("fwd", 4096, 768, 3072): (10, 4, 0, False),  # in place of the transposed problem
    ("dgrad", 4096, 3584, 3584): (3, 0, 0, False),  # 5 waves of 192 vs 4 of 256; v0.40: 7 of 128
    ("fwd", 16384, 128, 8192): (15, 2, 0, False),  # 128 tiles: v0.40 one_wave (0.972 vs 0.787)
    # rule: transposed, which wgrad cannot be; v0.43: 96 tiles of 128x192 (73% of a wave) where
    # 144 of 128x128 spill into a second wave: config 1
    ("wgrad", 3072, 768, 512): (18, 1, 0, False),  # v0.49 whole_waves (was (1, 2))
    # config 0 and its swizzle (v0.10): 2 from 48 tiles along the grid's shorter side
    ("fwd", 16384, 18944, 3584): (0, 2, 0, False),
    ("fwd", 16384, 14336, 4096): (0, 2, 0, False),
    ("fwd", 16384, 4096, 14336): (0, 0, 0, False),  # 16 tiles along N
    ("fwd", 4096, 11008, 4096): (0, 0, 0, False),  # 2752 tiles of 128x128: config 0 (v0.26)
    ("dgrad", 4096, 11008, 4096): (0, 0, 0, False),
    ("wgrad", 16384, 4096, 4096): (0, 0, 0, False),  # 4096 tiles
    ("fwd", 2048, 11008, 4096): (3, 0, 0, False),  # 1376 tiles of 128x128, K <= 4096: ping-pong
    ("fwd", 4096, 4096, 11008): (0, 0, 0, False),  # K > 4096
    ("fwd", 8192, 16384, 4096): (0, 2, 0, False),  # 8192 tiles: beyond 4096, config 0 swizzle 2
    # ping-pong for short K from 512 tiles (v0.8), beyond config 14's four waves (v0.22)
    ("fwd", 4096, 8192, 1024): (3, 0, 0, False),
    # v0.32: the K = 1025-2048 clause of the H100 sweeps (config 14 here) was not taken: on the
    # H200 ping-pong stayed ahead (4096 x 4096 x 2048 forward 1.020-1.030 vs 0.988 on config 14,
    # results/sweep_nvidia-h200_20261128-090700.json)
    ("fwd", 4096, 4096, 2048): (3, 0, 0, False),
    ("dgrad", 4096, 2048, 2048): (3, 0, 0, False),
    # config 13, tiles filling one wave, swizzle 2 (v0.22: 128x64; v0.28: 64x128 ping-pong)
    ("wgrad", 1024, 1024, 4096): (13, 2, 0, False),  # in place of split-K
    ("fwd", 4096, 256, 1024): (13, 2, 0, False),  # in place of the transposed problem
    # config 14, 256x128 tiles, swizzle 2 (v0.22): up to a wave with K <= 4096, four with K <= 1024
    ("dgrad", 4096, 1024, 256): (14, 2, 0, False),
    ("fwd", 4096, 1024, 4096): (15, 2, 0, False),  # 256 tiles: v0.40 two_waves
    ("dgrad", 4096, 1024, 4096): (15, 2, 0, False),
    ("wgrad", 1024, 4096, 4096): (15, 2, 0, False),
    ("fwd", 4096, 1024, 8192): (0, 0, 0, False),  # two waves over K > 4096: config 14 or 0
    ("wgrad", 3072, 1024, 4096): (19, 1, 0, False),  # v0.49 whole_waves (was (14, 2))
    ("wgrad", 4096, 4096, 1024): (14, 2, 0, False),  # 512 tiles
    # v0.36: config 3 in config 14's place for the forward and dgrad layouts with 256 < K <= 1024
    # (inside compiled H200 steps: 4096 x 4096 x 1024 forward 46.5 vs 51.5 us, dgrad 46.5 vs
    # 51.2; 4096 x 2816 x 1024 37.5 vs 39.9; 4096 x 1024 x 1024 15.6 vs 16.2)
    ("fwd", 4096, 4096, 1024): (3, 0, 0, False),
    ("dgrad", 4096, 4096, 1024): (3, 0, 0, False),
    ("fwd", 4096, 3072, 1024): (3, 0, 0, False),
    # v0.37: config 15 (config 3 without a cluster) for the forward layout of outputs at most
    # 8 tiles of 128 wide over 1.5-3 waves of 128x128 tiles, 256 < K <= 3072 (isolated, H200:
    # 4096 x 1024 x 1024 16.49 us vs 16.82 on config 3; 4096 x 1024 x 2816 38.83 vs 38.46 on
    # config 3 and 39.11 on config 14; tied with config 3 inside compiled steps)
    ("fwd", 4096, 1024, 1024): (15, 0, 0, False),
    ("fwd", 4096, 1024, 512): (15, 0, 0, False),
    ("fwd", 4096, 1024, 264): (15, 0, 0, False),
    ("fwd", 4096, 1024, 1032): (15, 0, 0, False),
    ("fwd", 4096, 1024, 2816): (15, 0, 0, False),
    ("fwd", 4096, 1024, 3072): (15, 0, 0, False),
    ("fwd", 4096, 1024, 3080): (15, 2, 0, False),  # K > 3072: v0.40 two_waves
    ("fwd", 4096, 1024, 256): (14, 2, 0, False),  # K <= 256: the short-K branch, unchanged
    ("fwd", 8192, 1024, 1024): (3, 0, 0, False),  # 512 tiles: more than 3 waves
    ("fwd", 3200, 1024, 1024): (15, 0, 0, False),  # 200 tiles: just over 1.5 waves
    ("fwd", 3072, 1024, 1024): (7, 0, 0, True),  # 192 tiles: under 1.5 waves, transposed as before
    # v0.49 whole_waves (was (0, 0)): config 14's gate refuses it (73% full waves)
    ("fwd", 6144, 1024, 1024): (19, 1, 0, False),
    ("wgrad", 4096, 1024, 1024): (15, 2, 0, False),  # not v0.37's clause: v0.40 two_waves
    # v0.38: config 15 for the dgrad layout of the same domain (isolated, H200: 4096 x 1024 x
    # 1024 16.2 vs 16.3-16.4 us on config 3; inside compiled llama-host steps 15.0 vs 15.2, and
    # 4096 x 1024 x 2816 33.4 vs 33.7 on config 14)
    ("dgrad", 4096, 1024, 1024): (15, 0, 0, False),  # was config 3 (v0.36)
    ("dgrad", 4096, 1024, 264): (15, 0, 0, False),
    ("dgrad", 4096, 1024, 1032): (15, 0, 0, False),  # was config 14
    ("dgrad", 4096, 1024, 2816): (15, 0, 0, False),  # was config 14
    ("dgrad", 4096, 1024, 3072): (15, 0, 0, False),
    ("dgrad", 4096, 1024, 3080): (15, 2, 0, False),  # K > 3072: v0.40 two_waves
    ("dgrad", 3200, 1024, 1024): (15, 0, 0, False),  # just over 1.5 waves
    ("dgrad", 8192, 1024, 1024): (3, 0, 0, False),  # 512 tiles: more than 3 waves, config 3
    # v0.32: over more than a wave with 256 < K <= 1024, config 14 only where its
    # waves are 80% full (4096 x 2304 x 768: 288 tiles, 73%: config 3, 0.900 vs 0.784 on the
    # H100, 0.940 vs 0.794 on the H200)
    ("fwd", 4096, 2304, 768): (3, 0, 0, False),
    ("wgrad", 4096, 2560, 1024): (14, 2, 0, False),  # 320 tiles: 81% of three waves
    ("fwd", 4096, 2560, 1024): (3, 0, 0, False),  # v0.36: the forward layout runs ping-pong
    ("fwd", 4096, 2304, 256): (14, 2, 0, False),  # K <= 256: not measured, unchanged
    ("wgrad", 2304, 4096, 768): (14, 2, 0, False),  # the weight gradient: not measured, unchanged
    ("fwd", 1024, 5120, 512): (10, 0, 0, False),  # 160 tiles, 61%: 128x192, H100 0.926 vs 0.804
    # v0.32: the 128x192 tile where K is too long for the transposed problem
    # (1024 x 2816 x 4096 forward 0.897 vs 0.754 on config 14, H200 0.912 vs 0.761; dgrad layout
    # 0.959 vs 0.784, H200 0.960 vs 0.790)
    ("fwd", 1024, 2816, 4096): (10, 0, 0, False),
    ("dgrad", 1024, 2816, 4096): (10, 0, 0, False),
    # v0.40, the wave-fill clauses (with_wave_fill; the sweep of every configuration over the
    # shape set, results/sweep_nvidia-h200_20261202-122047.json). one_wave: config 15, swizzle
    # 2, for 66 < t <= 132 tiles of 128x128 with K > 256
    ("dgrad", 512, 4096, 1024): (15, 2, 0, False),  # 128 tiles (0.952 vs 0.896 transposed)
    ("dgrad", 512, 3072, 768): (17, 1, 0, False),  # v0.49 whole_waves (was (15, 2); 96 tiles)
    ("fwd", 512, 3584, 3584): (15, 2, 0, False),  # 112 tiles (0.902 vs 0.854 on config 2)
    ("fwd", 512, 4096, 1024): (7, 0, 0, True),  # a forward transposed over K <= 1024 stays so
    ("fwd", 512, 4096, 1032): (15, 2, 0, False),
    ("dgrad", 512, 4096, 256): (7, 0, 0, True),  # K <= 256: no clause
    ("dgrad", 512, 2048, 4096): (2, 0, 2, False),  # 64 tiles: under half a wave, no clause
    ("dgrad", 512, 2176, 4096): (15, 2, 0, False),  # 68 tiles
    ("wgrad", 512, 4224, 4096): (15, 0, 0, False),  # 4 x 33 = 132; a swizzle of 2 walks 4 x 34
    ("wgrad", 512, 4352, 4096): (2, 0, 0, False),  # 136 tiles: over a wave, no clause
    ("fwd", 1408, 1536, 4096): (15, 0, 0, False),  # 11 x 12 = 132; a swizzle of 2 walks 12 x 12
    # two_waves: 232 <= t <= 264 with 256 < K <= 4096, in place of configs 0, 14, 2
    ("fwd", 512, 8192, 1024): (15, 2, 0, False),  # 256 tiles (1.002 vs 0.967)
    ("fwd", 512, 8192, 3584): (15, 2, 0, False),  # (0.967 vs 0.905)
    ("fwd", 512, 7424, 4096): (15, 2, 0, False),  # 232 tiles
    ("fwd", 512, 8448, 4096): (15, 2, 0, False),  # 264 tiles
    ("dgrad", 512, 8192, 1024): (0, 0, 0, False),  # the dgrad layout over K <= 1024: no clause
    ("dgrad", 512, 8192, 128): (0, 0, 0, False),
    ("dgrad", 512, 8192, 1032): (15, 2, 0, False),
    ("wgrad", 4096, 1024, 4096): (15, 2, 0, False),  # (0.985 vs 0.947)
    # short_wgrad: the weight gradient over at most 512 tokens on configs 14 / 0
    ("wgrad", 4096, 4096, 512): (15, 2, 0, False),  # 1024 tiles (1.125 vs 0.960)
    ("wgrad", 8192, 1024, 512): (15, 2, 0, False),  # (1.071 vs 0.954)
    ("wgrad", 4096, 4096, 520): (14, 2, 0, False),  # over 512 tokens: not measured
    # v0.49 whole_waves (was (15, 2)): the rule transposes; wgrad cannot (0.927 vs 0.868)
    ("wgrad", 1024, 2816, 512): (19, 1, 0, False),
    # wide_data_parallel: the forward and dgrad layouts' data-parallel config 2 -> config 1
    ("fwd", 512, 18944, 3584): (1, 0, 0, False),  # (0.997 vs 0.869)
    ("dgrad", 512, 18944, 3584): (1, 0, 0, False),  # (1.023 vs 0.878)
    ("fwd", 512, 12288, 4096): (1, 0, 0, False),  # (0.995 vs 0.941)
    # pingpong_waves: config 3 where its 128x128 waves cost less than the 128x192 ones
    ("fwd", 4096, 3584, 3584): (3, 0, 0, False),  # 7 waves of 128 vs 5 of 192 (1.082 vs 0.988)
    ("fwd", 4096, 3584, 18944): (3, 0, 0, False),
    ("dgrad", 4096, 3584, 8192): (3, 0, 0, False),
    ("fwd", 4096, 4096, 4096): (0, 0, 0, False),  # 512 tiles over K = 4096: config 0
    ("fwd", 4096, 1024, 8192): (0, 0, 0, False),  # one wave over K > 4096: not measured
    ("fwd", 4096, 8192, 512): (3, 0, 0, False),  # 1024 tiles: beyond four waves
    # no swizzle where its rounding of the tile grid would add a wave (v0.24): 13 x 10 tiles of
    # 256x128 are 130, one wave; with a swizzle of 2 CUTLASS's scheduler walks 14 x 12 = 168
    # (the weight gradient's layout: the forward's and dgrad's run config 3 at K <= 1024, v0.36)
    ("wgrad", 3328, 1280, 1024): (15, 2, 0, False),  # v0.40 two_waves (260 tiles of 128x128)
    ("wgrad", 2816, 1536, 1024): (15, 2, 0, False),  # 11 x 12 = 132 (config 14); v0.40 two_waves
    ("wgrad", 2816, 2816, 1024): (14, 1, 0, False),  # 11 x 22 = 242 -> 12 x 24 = 288: 3 waves
    ("wgrad", 3072, 2816, 1024): (14, 1, 0, False),  # 12 x 22 = 264 (2 waves) -> 12 x 24 = 288 (3)
    ("wgrad", 4096, 2816, 1024): (14, 2, 0, False),  # 16 x 22 = 352 -> 16 x 24 = 384: 3 waves either way
    ("fwd", 4096, 2816, 1024): (3, 0, 0, False),
    ("dgrad", 4096, 2816, 1024): (3, 0, 0, False),
    ("wgrad", 5120, 512, 1024): (10, 0, 0, False),  # 40 x 3 tiles of 128x192: 120 -> 40 x 4 = 160
    # the 128x192 tile in place of the transposed problem again where config 14 had displaced it
    # from the row-major rule (v0.25): N >= 2048, not the weight gradient's layout
    ("fwd", 1024, 2816, 2816): (10, 0, 0, False),  # transposed 0.61, config 14 0.74-0.77, 10 0.90-0.94
    ("dgrad", 1024, 3072, 1024): (10, 0, 0, False),
    # v0.49 whole_waves (was (14, 2)): no transposed kernels: config 14 stays
    ("wgrad", 2816, 1024, 1024): (19, 1, 0, False),
    ("fwd", 2048, 1536, 1024): (7, 0, 0, True),  # N < 2048: the 128x192 tile is slow there
    # config 0, not ping-pong, for the weight gradient of 1025-2047 tiles over more than 2048
    # tokens (v0.27: in the compiled steps of bench --what step-sweep and isolated)
    ("wgrad", 32000, 1024, 4096): (0, 0, 0, False),  # the language-model head: 357 vs 383-393 us
    ("wgrad", 11008, 2048, 4096): (0, 0, 0, False),
    ("wgrad", 5120, 5120, 4096): (0, 0, 0, False),  # isolated 0.903 vs 0.828 of cuBLAS
    ("wgrad", 32000, 1024, 2048): (3, 0, 0, False),  # over exactly 2048 tokens: as before
    ("wgrad", 32000, 1024, 2049): (0, 0, 0, False),
    ("dgrad", 4096, 1024, 32000): (0, 0, 0, False),  # the head's other GEMMs do not change
    ("fwd", 4096, 32000, 1024): (3, 0, 0, False),
}


@pytest.mark.parametrize("case", RULE_CASES, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}x{c[3]}")
def test_rule_at_transformer_shapes(harness, case):
    op, m, n, k = case
    got = plan(harness, op, m, n, k)
    assert (got.config, got.swizzle, got.splits, got.transposed) == RULE_CASES[case], got
    # bf16 out: the input dtype's kernels, or the float32 partial products of a batched split-K
    assert got.kernel.startswith("sm90_tma_ws_bf16_bf16_") or (
        got.splits < 0 and got.kernel == BATCHED_PARTIALS_KERNEL), got
    assert ("swapab" in got.kernel) == got.transposed, got


def _scheduled_tiles(rows, cols, cluster_m, cluster_n, swizzle):
    """CUTLASS 4.2's SM90 persistent scheduler (tile_scheduler_params.h, written out here
    independently of the rule's C++): CTA tiles per side rounded up to the cluster, the
    swizzle lowered by the grid's shorter side, each side then rounded up to cluster x swizzle."""
    up = lambda x, to: -(-x // to) * to  # noqa: E731
    rows, cols = up(rows, cluster_m), up(cols, cluster_n)
    shorter = min(rows, cols)
    applied = 8 if swizzle >= 8 and shorter >= 6 else 4 if swizzle >= 4 and shorter >= 3 else (
        2 if swizzle >= 2 and shorter >= 2 else 1)
    return up(rows, applied * cluster_m) * up(cols, applied * cluster_n)


# the configurations the rule picks with a swizzle: tile (rows, cols), cluster (m, n)
_CLUSTERED = {13: ((64, 128), (1, 1)), 14: ((256, 128), (1, 2)), 10: ((128, 192), (2, 1)),
              1: ((128, 192), (1, 1)), 15: ((128, 128), (1, 1))}


@pytest.mark.parametrize("op", ["fwd", "dgrad", "wgrad"])
def test_rule_swizzle_never_adds_a_wave(harness, op):
    """Over a grid of transformer-like shapes, whenever the rule gives configuration 1, 10, 13,
    14 or 15 a swizzle, the tiles CUTLASS's scheduler then walks take no more waves of the SMs than
    with no swizzle (v0.24: 3328 x 1280 x 1024 ran two waves with a swizzle of 2, at 0.57 of
    cuBLAS, against 0.95 with one)."""
    checked = 0
    for t in (1000, 1024, 3000, 3328, 4096, 5000):
        for out in (512, 768, 1280, 1536, 2816, 3072, 5120):
            for inner in (1024, 2816, 4096):
                m, n, k = {"fwd": (t, out, inner), "dgrad": (t, inner, out),
                           "wgrad": (out, inner, t)}[op]
                got = plan(harness, op, m, n, k)
                if got.config not in _CLUSTERED or got.swizzle <= 1 or got.transposed:
                    continue
                (tm, tn), (cm, cn) = _CLUSTERED[got.config]
                rows, cols = -(-m // tm), -(-n // tn)
                waves = [-(-_scheduled_tiles(rows, cols, cm, cn, s) // SMS) for s in (1, got.swizzle)]
                assert waves[1] == waves[0], (op, m, n, k, got, waves)
                checked += 1
    assert checked > 0  # the rule does swizzle some of these


def test_float32_output_weight_gradient_keeps_ping_pong(harness):
    """v0.27 moved the 16-bit-output weight gradients of 1025-2047 tiles over 2049-4096 tokens
    to config 0 on bf16 measurements; a float32 output (main-gradient accumulation) keeps
    config 3."""
    got = plan(harness, "wgrad", 32000, 1024, 4096, out_f32=True)
    assert (got.config, got.swizzle, got.splits) == (3, 0, 0), got
    assert got.kernel == "sm90_tma_ws_bf16_f32_nt_128x128x64_1x2x1_pingpong", got
    assert plan(harness, "wgrad", 32000, 1024, 4096).config == 0


def test_float32_output_never_gets_the_16bit_only_configurations(harness):
    # configurations 1 and 10-15 have kernels with the input dtype out only
    for m, n, k in [(256, 1024, 4096), (256, 1024, 512), (1024, 2816, 4096), (3072, 768, 512),
                    (768, 768, 4096), (1024, 1024, 4096), (3072, 1024, 4096), (2816, 1024, 4096)]:
        got = plan(harness, "wgrad", m, n, k, out_f32=True)
        assert got.config not in (1, 10, 11, 12, 13, 14, 15) and "bf16_f32_nt" in got.kernel, (
            m, n, k, got)
    # v0.30's clause (config 1 for 2816 x 1024 over 4096 tokens) is for 16-bit outputs: a float32
    # one keeps the stream-K it had
    got = plan(harness, "wgrad", 2816, 1024, 4096, out_f32=True)
    assert (got.config, got.swizzle, got.splits) == (2, 0, 0), got
    # v0.29's clause (config 13 for 768 x 768 over 4096 tokens) is for 16-bit outputs: a float32
    # one keeps the split-K it had
    got = plan(harness, "wgrad", 768, 768, 4096, out_f32=True)
    assert (got.config, got.swizzle, got.splits) == (2, 0, 3), got


def test_wave_fill_clauses_only_for_16bit_outputs_without_fused_epilogue(harness):
    """v0.40's clauses (config 15 / 1 / 3 in place of the rule's choice) were measured with
    16-bit outputs and plain or bias epilogues: a float32 output (main-gradient accumulation)
    and a fused activation keep what they had."""
    for op, m, n, k in [("wgrad", 4096, 4096, 512), ("wgrad", 4096, 1024, 4096),
                        ("wgrad", 2304, 768, 4096)]:
        assert plan(harness, op, m, n, k).config == 15
        got = plan(harness, op, m, n, k, out_f32=True)
        assert got.config != 15 and "bf16_f32_nt" in got.kernel, (op, m, n, k, got)
    # a fused activation runs on the fused kernels (config 3's tile), not on config 15 / 1
    for m, n, k in [(4096, 1024, 4096), (512, 3584, 3584), (512, 18944, 3584)]:
        got = plan(harness, "fwd", m, n, k, fused=True)
        assert got.config in (3, -1), (m, n, k, got)
    # a bias keeps the clause (the kernel with C)
    got = plan(harness, "fwd", 4096, 1024, 4096, c_mode=1)
    assert got.config == 15 and "_noc_" not in got.kernel, got
    # the rule's own swizzle goes with a forced other configuration
    forced = plan(harness, "fwd", 4096, 1024, 4096, config=3)
    assert (forced.config, forced.swizzle) == (3, 0), forced


def test_wave_fill_clause_edges(harness):
    """v0.40's clauses at their edges (a second reading's cases)."""
    def cfg(op, m, n, k, **kw):
        got = plan(harness, op, m, n, k, **kw)
        return (got.config, got.swizzle, got.splits, got.transposed)

    # one_wave: 66 tiles are half a wave (no clause), 68 take it; tile counts follow the SMs
    assert cfg("dgrad", 256, 4224, 4096) == (2, 0, 2, False)
    assert cfg("dgrad", 256, 4352, 4096) == (15, 2, 0, False)
    assert plan(harness, "fwd", 512, 3584, 3584, sms=114).config == 15
    assert plan(harness, "fwd", 512, 3584, 3584, sms=264).config != 15  # under half of 264
    # a forward the rule transposes keeps the transposed kernels over K <= 1024
    assert cfg("fwd", 512, 4096, 1024) == (7, 0, 0, True)
    # the weight gradient the rule would transpose (it cannot run so) takes the clauses
    # (v0.49: the whole_waves clause then takes config 19's 192x128 tiles, 6 x 22 = 132 of them)
    got = plan(harness, "wgrad", 1024, 2816, 512)
    assert 4 <= got.rule[0] <= 7 and (got.config, got.swizzle) == (19, 1), got
    # short_wgrad from K = 257 (K <= 256 keeps the short-K configurations)
    assert cfg("wgrad", 4096, 4096, 256)[0] == 8
    assert cfg("wgrad", 4096, 4096, 257)[0] == 15


def test_wave_fill_clauses_stay_in_the_measured_domain(harness):
    """The clauses replace only the choices, K range, wave band and row counts the sweep measured
    them against (a second reading's cases: v0.40 as first built reached past them)."""
    def cfg(op, m, n, k, **kw):
        got = plan(harness, op, m, n, k, **kw)
        return (got.config, got.swizzle, got.splits, got.transposed)

    # one_wave: not over K > 18944 (a 32768-token weight gradient keeps stream-K)
    assert cfg("wgrad", 1024, 1280, 32768)[0] == 2
    # one_wave: not in place of configs 1 / 11 / 13
    assert plan(harness, "fwd", 2112, 512, 4096).rule[:2] == (13, 1)
    assert cfg("fwd", 2112, 512, 4096)[:2] == (13, 1)
    assert plan(harness, "wgrad", 14336, 128, 4096).config == 1
    # wide_data_parallel: over <= 512 rows only; tall outputs keep data-parallel config 2
    assert cfg("fwd", 8192, 1280, 2048)[:3] == (2, 0, 1)
    assert cfg("fwd", 640, 6784, 4096)[:3] == (2, 0, 1)
    assert plan(harness, "fwd", 512, 18944, 3584).config == 1
    # two_waves from 7/4 of a wave: 231 tiles of 128x128 on 132 SMs take it, 230 do not
    assert 4 * 231 >= 7 * 132 > 4 * 230
    assert cfg("fwd", 128 * 21, 128 * 11, 2048)[0] == 15  # 231 tiles
    assert cfg("fwd", 128 * 23, 128 * 10, 2048)[0] != 15  # 230 tiles
    # the forward's K <= 1024 exception also where the transposed problem cannot run (beta = 1)
    got = plan(harness, "fwd", 512, 4096, 1024, c_mode=2, without_c=False)
    assert 4 <= got.rule[0] <= 7 and got.config == 2 and not got.transposed, got
    got = plan(harness, "fwd", 512, 4096, 2048, c_mode=2, without_c=False)
    assert got.config == 15, got  # over K > 1024 the clause holds there too


def test_forced_configuration_runs_without_the_rules_swizzle(harness):
    assert plan(harness, "fwd", 16384, 18944, 3584).swizzle == 2
    forced = plan(harness, "fwd", 16384, 18944, 3584, config=3)
    assert (forced.config, forced.swizzle) == (3, 0) and "pingpong" in forced.kernel
    both = plan(harness, "fwd", 16384, 18944, 3584, config=3, swizzle=8)
    assert (both.config, both.swizzle) == (3, 8)
    # the rule's own configuration forced: its swizzle stays
    assert plan(harness, "fwd", 16384, 18944, 3584, config=0).swizzle == 2
    assert plan(harness, "fwd", 4096, 768, 3072, config=0).swizzle == 0


def test_forced_wgrad_only_configuration_gives_way_on_the_forward(harness):
    for config in (11, 12):
        got = plan(harness, "fwd", 4096, 4096, 4096, config=config)
        assert got.config == 0 and got.kernel.endswith("128x256x64_2x1x1_coop"), got


def test_fused_epilogue(harness):
    # where the 128x192 tile replaces the transposed problem, the plain GEMM runs there and the
    # caller applies the activation (no fused kernel: config -1)
    got = plan(harness, "fwd", 4096, 768, 3072, fused=True)
    assert (got.config, got.kernel) == (-1, "-"), got
    # likewise where v0.25 gives the transposed problem to the 128x192 tile
    got = plan(harness, "fwd", 1024, 2816, 2816, fused=True)
    assert (got.config, got.kernel) == (-1, "-"), got
    # elsewhere the fused ping-pong kernels, with CUTLASS's own walk (swizzle 0) where the
    # rule's tile is config 0
    assert plan(harness, "fwd", 4096, 16384, 4096).rule[0] == 0
    got = plan(harness, "fwd", 4096, 16384, 4096, fused=True)
    assert (got.config, got.swizzle) == (3, 0) and got.kernel.endswith("pingpong_relu"), got
    # v0.47: unless that walk would re-stream an operand larger than the L2 (A: 16384 x 3584)
    got = plan(harness, "fwd", 16384, 18944, 3584, fused=True)
    assert (got.config, got.kernel) == (-1, "-"), got
    got = plan(harness, "fwd", 4096, 3584, 3584, fused=True)
    assert got.config == 3 and got.kernel.endswith("pingpong_relu"), got


# v0.45: the MLP shapes of `bench --what linact --linact-set mlp` (T x 4h x h) and a few more
FUSED_POLICY_SHAPES = [(t, 4 * h, h) for h in (768, 1024, 2048, 4096) for t in (4096, 16384)] + [
    (16384, 18944, 3584), (4096, 3584, 3584), (2048, 11008, 4096)]


# v0.47: the shapes among them where config 3's walk would re-stream an operand of more than
# 40 MB (B of 16384 x 16384 x 4096, A of 16384 x 18944 x 3584) and the rule's tile is config 0
RESTREAMING_SHAPES = {(16384, 16384, 4096), (16384, 18944, 3584)}


@pytest.mark.parametrize("shape", FUSED_POLICY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gelu_with_the_pre_activation_runs_unfused(harness, shape):
    """v0.45 - v0.47: the erf GELU epilogue that also stores the pre-activation (the training
    path) is left to the caller (config -1: the rule's GEMM, then the activation pass) over
    K < 2048; every fused epilogue (ReLU, GELU(tanh), the erf form over K >= 2048, and GELU
    without the pre-activation: inference) keeps the fused kernels wherever config 3's walk does
    not re-stream a large operand (v0.47), whatever the rule's own tile."""
    m, n, k = shape
    restreams = shape in RESTREAMING_SHAPES
    for act, suffix in (("relu", "relu"), ("gelu_tanh", "gelutanh"), ("gelu", "gelu")):
        got = plan(harness, "fwd", m, n, k, fused=act, aux=True)
        if restreams or (act == "gelu" and k < 2048):
            assert (got.config, got.kernel) == (-1, "-"), (act, got)
        else:
            assert got.config == 3 and got.kernel.endswith(f"pingpong_{suffix}_aux"), (act, got)
    for act, suffix in (("gelu", "gelu"), ("gelu_tanh", "gelutanh")):
        inference = plan(harness, "fwd", m, n, k, fused=act)
        if restreams:
            assert (inference.config, inference.kernel) == (-1, "-"), (act, inference)
        else:
            assert inference.config == 3 and inference.kernel.endswith("pingpong_" + suffix), (
                act, inference)
    # what the caller then runs: the rule's plain GEMM with the bias, on a real kernel
    gemm = plan(harness, "fwd", m, n, k, c_mode=1)
    assert gemm.kernel != "-" and not gemm.kernel.endswith(("relu", "gelu", "gelutanh", "_aux"))


def test_gelu_with_the_pre_activation_fused_beside_the_rules_tile(harness):
    """v0.47: GELU(tanh) and, over K >= 2048, the erf form with the pre-activation run fused
    where the rule's own tile is another (config 0 at 4096 x 16384 x 4096: the fused forward was
    faster there, 820-896 against 954-1017 us unfused), but not where config 3's walk re-streams
    an operand (16384 x 16384 x 4096)."""
    small = plan(harness, "fwd", 4096, 3072, 768, fused="gelu_tanh", aux=True)
    assert small.rule[0] == 3 and small.kernel.endswith("pingpong_gelutanh_aux"), small
    for act, suffix in (("gelu_tanh", "gelutanh"), ("gelu", "gelu")):
        beside = plan(harness, "fwd", 4096, 16384, 4096, fused=act, aux=True)
        assert beside.rule[0] == 0 and beside.kernel.endswith(f"pingpong_{suffix}_aux"), beside
        large = plan(harness, "fwd", 16384, 16384, 4096, fused=act, aux=True)
        assert large.rule[0] == 0 and (large.config, large.kernel) == (-1, "-"), large


def test_erf_gelu_with_the_pre_activation_fused_over_long_k(harness):
    """v0.47: the erf GELU + pre-activation back on the fused kernel over K >= 2048 (the MLP
    shapes with h >= 2048 whose walk keeps the operands in L2), unfused over shorter K."""
    for shape in ((4096, 8192, 2048), (16384, 8192, 2048), (2048, 11008, 4096),
                  (4096, 16384, 4096)):
        got = plan(harness, "fwd", *shape, fused="gelu", aux=True)
        assert got.config == 3 and got.kernel.endswith("pingpong_gelu_aux"), (shape, got)
    for shape in ((4096, 3072, 768), (16384, 4096, 1024), (4096, 8192, 2047)):
        got = plan(harness, "fwd", *shape, fused="gelu", aux=True)
        assert got.rule[0] == 3 and (got.config, got.kernel) == (-1, "-"), (shape, got)


def test_fused_walk_restreaming_a_large_operand_runs_unfused(harness):
    """v0.47: config 3's walk (along N when there are at least as many tile rows as columns,
    streaming B once per row; along M otherwise, A once per column) decides with the operand's
    bytes against 40 MB, for every fused epilogue, where the rule's tile is another."""
    cases = {
        (16384, 16384, 4096): True,  # along N, B 128 MB
        (16384, 8192, 2048): False,  # along N, B 32 MB (and the rule's tile is config 3)
        (4096, 16384, 4096): False,  # along M, A 32 MB
        (8192, 16384, 4096): True,  # along M, A 64 MB
        (8192, 8192, 8192): True,  # along N (equal counts), B 128 MB
    }
    for shape, unfused in cases.items():
        for aux in (False, True):
            got = plan(harness, "fwd", *shape, fused="relu", aux=aux)
            if unfused:
                assert got.rule[0] != 3 and (got.config, got.kernel) == (-1, "-"), (shape, got)
            else:
                assert got.config == 3 and got.kernel.endswith(
                    "pingpong_relu_aux" if aux else "pingpong_relu"), (shape, got)
    # the bound itself, 40 MiB of B (n x k x 2 bytes): 5120 x 4096 is exactly at it (fused),
    # 5120 x 4224 over it (unfused), both walking along N on config 0's rule
    at = plan(harness, "fwd", 16384, 5120, 4096, fused="relu")
    over = plan(harness, "fwd", 16384, 5120, 4224, fused="relu")
    assert at.rule[0] == over.rule[0] == 0, (at, over)
    assert at.config == 3 and (over.config, over.kernel) == (-1, "-"), (at, over)


def test_forced_configuration_keeps_the_fused_gelu(harness):
    """A forced configuration (the sweeps, the autotune) still times the fused kernel."""
    got = plan(harness, "fwd", 4096, 3072, 768, fused="gelu", aux=True, config=3)
    assert got.config == 3 and got.kernel.endswith("pingpong_gelu_aux"), got


# The kernels without a C operand (EpilogueKind::kLinCombNoC): configs 3 and 15 (v0.38), 0 and 14
# (v0.39), 17-19 (v0.49), 16-bit in and out, every layout; a plain product takes them, a bias or
# beta != 0 does not.
WITHOUT_C_TILES = {3: "128x128x64_1x2x1_pingpong", 15: "128x128x64_1x1x1_pingpong",
                   0: "128x256x64_2x1x1_coop", 14: "256x128x64_1x2x1_coop",
                   17: "128x96x64_1x1x1_pingpong", 18: "192x96x64_1x1x1_pingpong",
                   19: "192x128x64_1x1x1_pingpong"}


@pytest.mark.parametrize("op", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("config", sorted(WITHOUT_C_TILES))
def test_plain_product_takes_the_kernel_without_c(harness, op, config):
    p = plan(harness, op, 4096, 2816, 1024, config=config)
    assert p.config == config and p.kernel.endswith("_noc_" + WITHOUT_C_TILES[config]), p
    kept = plan(harness, op, 4096, 2816, 1024, config=config, without_c=False)
    assert kept.config == config and kept.kernel.endswith("_" + WITHOUT_C_TILES[config])
    assert "_noc_" not in kept.kernel and kept.kernel == p.kernel.replace("_noc_", "_")


@pytest.mark.parametrize("c_mode", [1, 2], ids=["bias", "beta1"])
def test_bias_or_accumulation_keeps_the_kernel_with_c(harness, c_mode):
    for config, tile in WITHOUT_C_TILES.items():
        p = plan(harness, "fwd", 4096, 2816, 1024, config=config, c_mode=c_mode)
        assert p.config == config and p.kernel.endswith(tile) and "_noc_" not in p.kernel, p


def test_kernels_without_c_only_where_built(harness):
    # the rule's own choices: configs 15 / 3 / 0 run without C, config 13 (no such kernel) with it
    assert plan(harness, "fwd", 4096, 1024, 1024).kernel.endswith("_noc_128x128x64_1x1x1_pingpong")
    assert plan(harness, "fwd", 4096, 2816, 1024).kernel.endswith("_noc_128x128x64_1x2x1_pingpong")
    big = plan(harness, "fwd", 4096, 4096, 4096)
    assert big.config == 0 and big.kernel.endswith("_noc_128x256x64_2x1x1_coop"), big
    small = plan(harness, "wgrad", 1024, 1024, 4096)
    assert small.config == 13 and "_noc_" not in small.kernel, small
    # a float32 output (the main-gradient wgrad) has no kernel without C
    f32 = plan(harness, "wgrad", 4096, 4096, 1024, out_f32=True, config=3)
    assert "_noc_" not in f32.kernel and "bf16_f32" in f32.kernel


BATCHED_PARTIALS_KERNEL = "sm90_tma_ws_bf16_f32_nt_128x128x64_1x1x1_coop_streamk"


def test_batched_split_k_rule_and_its_domain(harness):
    """The rule's batched split-K (v0.42): the weight gradient's layout, at most a quarter wave
    of 128x128 tiles, K >= 8192; as many slices as fill a wave, each >= 2048 deep, dividing K;
    config 2's float32-output kernel computes the slices, whatever the output dtype."""
    for out_f32 in (False, True):
        got = plan(harness, "wgrad", 256, 1024, 16384, out_f32=out_f32)
        assert (got.config, got.splits, got.kernel) == (2, -8, BATCHED_PARTIALS_KERNEL), got
    # beta = 1 accumulation (the reduction adds C)
    assert plan(harness, "wgrad", 256, 1024, 16384, c_mode=2).splits == -8
    assert plan(harness, "wgrad", 256, 1024, 12288).splits == -6  # K / 2048 slices
    assert plan(harness, "wgrad", 256, 1024, 16384, sms=114).splits == -4  # 7 and 5, 6 do not divide
    # outside the domain: no batched split-K
    assert plan(harness, "wgrad", 256, 1024, 8191).splits >= 0  # K < 8192
    assert plan(harness, "wgrad", 128, 8192, 16384).splits >= 0  # 64 tiles: over a quarter wave
    assert plan(harness, "fwd", 256, 1024, 16384).splits >= 0  # not the weight gradient's layout
    assert plan(harness, "dgrad", 256, 1024, 16384).splits >= 0
    assert plan(harness, "wgrad", 256, 1022, 16384).splits >= 0  # N not a multiple of 4


def test_batched_split_k_forced_and_its_fallback(harness):
    """splits < 0 forces the batched split-K where it fits; where it does not (another layout, K
    not a multiple of the slices) the rule's own plan runs, never a negative split."""
    assert plan(harness, "wgrad", 768, 3072, 4096, splits=-4).splits == -4
    assert plan(harness, "wgrad", 256, 1024, 16384, splits=-16).splits == -16
    rule = plan(harness, "wgrad", 256, 1024, 16383)  # 16383 = 3 x 43 x 127: three slices
    assert (rule.splits, rule.kernel) == (-3, BATCHED_PARTIALS_KERNEL)
    forced = plan(harness, "wgrad", 256, 1024, 16383, splits=-8)  # 16383 % 8 != 0: the rule's
    assert forced == rule
    odd = plan(harness, "wgrad", 256, 1024, 16381)  # a prime: no split divides it
    assert odd.splits >= 0 and odd == plan(harness, "wgrad", 256, 1024, 16381, splits=-8)
    fwd_rule = plan(harness, "fwd", 256, 1024, 16384)
    fwd = plan(harness, "fwd", 256, 1024, 16384, splits=-8)
    assert fwd.splits >= 0 and fwd.kernel == fwd_rule.kernel
    # at most 1 GiB of partial products: 4096 x 4096 in 8 slices (512 MiB), not in 64 (4 GiB)
    assert plan(harness, "wgrad", 4096, 4096, 8192, splits=-8).splits == -8
    assert plan(harness, "wgrad", 4096, 4096, 8192, splits=-64).splits >= 0
    # a forced configuration or split keeps the rule's batched split-K out
    assert plan(harness, "wgrad", 256, 1024, 16384, config=2).splits >= 0
    assert plan(harness, "wgrad", 256, 1024, 16384, splits=4).splits == 4


# v0.43 (gemm_dispatch.cu: tile64x128_takes_long_wgrad, tile192_no_cluster_takes_short_wgrad)
V043_CASES = {
    # one wave of 64x128 tiles over a long K, in place of config 11 / split-K / stream-K: the
    # 128 x 8192 weight gradient over 4096 and 16384 tokens (the small-M fallback's, since a
    # weight gradient cannot run transposed)
    ("wgrad", 128, 8192, 4096): (13, 0, 0, False),
    ("wgrad", 128, 8192, 16384): (13, 0, 0, False),
    ("wgrad", 128, 8192, 512): (11, 0, 0, False),  # K < 4096: config 11 stays (5.27 vs 5.05)
    ("wgrad", 128, 8192, 32768): (2, 0, 2, False),  # K > 16384: not measured, stream-K
    ("wgrad", 256, 1024, 4096): (11, 0, 0, False),  # 32 tiles of 64x128: a quarter wave
    ("wgrad", 256, 1024, 16384): (2, 0, -8, False),  # the batched split-K (v0.42) stays
    # the 256x128 / 128x256 tiles' outputs are not taken (the H100 had config 13 behind there:
    # 3072 x 1024 over 4096 tokens 0.699 vs 0.782-0.794)
    ("wgrad", 3072, 1024, 4096): (19, 1, 0, False),  # v0.49 whole_waves (was (14, 2))
    ("wgrad", 3072, 1024, 16384): (19, 1, 0, False),  # v0.49 whole_waves (was (0, 0))
    ("fwd", 128, 8192, 4096): (7, 0, 0, True),  # not the weight gradient's layout: transposed
    # config 1 for the weight gradient over <= 512 tokens: 128x192 tiles filling 70-100% of a
    # wave where 128x128 tiles spill under a quarter of a second one
    # v0.49 whole_waves (was (1, 2)): 6 x 16 = 96 tiles; 144 of 128x128
    ("wgrad", 768, 3072, 512): (18, 1, 0, False),
    ("wgrad", 3072, 768, 512): (18, 1, 0, False),  # v0.49 whole_waves (was (1, 2))
    ("wgrad", 768, 3072, 256): (1, 2, 0, False),  # any K up to 512
    # v0.49 whole_waves (was (0, 0)): K > 512: the rule's choice before v0.43
    ("wgrad", 768, 3072, 1024): (18, 1, 0, False),
    # v0.49 whole_waves (was (15, 2)): 176 tiles of 128x128: a third of a wave more
    ("wgrad", 2816, 1024, 512): (19, 1, 0, False),
    ("wgrad", 1024, 2816, 512): (19, 1, 0, False),  # v0.49 whole_waves (was (15, 2))
    ("wgrad", 2304, 768, 512): (15, 2, 0, False),  # 72 tiles of 128x192: under 70%
    # v0.49 whole_waves (was (15, 2)): 144 tiles of 128x192: over a wave
    ("wgrad", 3072, 1024, 512): (19, 1, 0, False),
    # v0.49 whole_waves (was (7, 0)): not the weight gradient's layout: transposed
    ("fwd", 768, 3072, 512): (18, 1, 0, False),
}


@pytest.mark.parametrize("case", sorted(V043_CASES), ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}x{c[3]}")
def test_v043_weight_gradient_clauses(harness, case):
    op, m, n, k = case
    got = plan(harness, op, m, n, k)
    assert (got.config, got.swizzle, got.splits, got.transposed) == V043_CASES[case], got


def test_v043_clauses_leave_float32_outputs_and_other_sm_counts_sane(harness):
    # the 16-bit-only configurations never reach a float32 output (main-gradient accumulation)
    for m, n, k in [(128, 8192, 4096), (768, 3072, 512), (3072, 768, 512)]:
        got = plan(harness, "wgrad", m, n, k, out_f32=True)
        assert got.config not in (1, 13) and "bf16_f32_nt" in got.kernel, (m, n, k, got)
    # on 114 SMs (H100 PCIe) the wave bounds move with the SM count: 96 tiles of 128x192 fill
    # 84% of a wave and 144 of 128x128 spill 30 tiles (over a quarter): config 1 is not taken
    got = plan(harness, "wgrad", 768, 3072, 512, sms=114)
    assert got.config != 1, got


def autotune_candidates() -> list[tuple[int, int, int]]:
    """The opt-in autotune's candidate list (config, splits, swizzle), read from its source
    (csrc/cuda/gemm_autotune.cpp's kCandidates), checked against the array's declared size."""
    import re

    source = (ROOT / "csrc" / "cuda" / "gemm_autotune.cpp").read_text()
    decl = re.search(r"std::array<std::array<int, 3>, (\d+)> kCandidates = \{\{(.*?)\}\};", source, re.S)
    assert decl, "kCandidates not found in gemm_autotune.cpp"
    body = re.sub(r"//[^\n]*", "", decl.group(2))
    triples = [tuple(int(v) for v in t) for t in re.findall(r"\{(-?\d+), (-?\d+), (-?\d+)\}", body)]
    assert len(triples) == int(decl.group(1))
    return triples


def test_autotune_candidates_that_stay_distinct_for_a_large_forward(harness):
    """The candidates the autotune times for a 4096^3 forward: those whose plans differ in
    kernel, transposition, split or effective swizzle (0 and 1 are one order), as its
    deduplication counts them; tests/test_cuda_autotune.py expects this count on the GPU."""
    seen = set()
    for config, splits, swizzle in autotune_candidates():
        p = plan(harness, "fwd", 4096, 4096, 4096, config=config, swizzle=swizzle, splits=splits)
        assert p.kernel != "-"
        seen.add((p.kernel, p.transposed, p.splits, max(p.swizzle, 1)))
    assert len(seen) == 27


def _gpu_rule_cases():
    """tests/test_cuda_kernel_selection.py's TRANSFORMER_RULE_CASES, read from its source (that
    module imports the GPU helpers): (op, layer shape, expected configuration)."""
    import ast

    tree = ast.parse((ROOT / "tests" / "test_cuda_kernel_selection.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "TRANSFORMER_RULE_CASES" for t in node.targets):
            # the bandwidth-dependent expectation, a name there, becomes its name here
            for sub in ast.walk(node.value):
                for field, value in ast.iter_fields(sub):
                    if isinstance(value, list):
                        value[:] = [ast.Constant(v.id) if isinstance(v, ast.Name) else v
                                    for v in value]
            return [c for c in ast.literal_eval(node.value)]
    raise AssertionError("TRANSFORMER_RULE_CASES not found")


GPU_RULE_CASES = _gpu_rule_cases()


@pytest.mark.parametrize("op,shape,config", GPU_RULE_CASES,
                         ids=[f"{op}-{'x'.join(map(str, s))}" for op, s, _ in GPU_RULE_CASES])
def test_the_gpu_selection_tests_expect_what_the_rule_plans(harness, op, shape, config):
    """The GPU test of the rule at transformer shapes, planned here on 132 SMs: its expectations
    follow the rule on every commit, not only where a GPU ran them ("linear" has a bias; a
    layer (T, N, K) runs the forward T x N x K, the dgrad T x K x N, the wgrad N x K x T)."""
    t, n, k = shape
    gemm = {"linear": ("fwd", t, n, k), "linear_dgrad": ("dgrad", t, k, n),
            "linear_wgrad": ("wgrad", n, k, t)}[op]
    c_mode = 1 if op == "linear" else 0
    if config == "PINGPONG_WAVES":  # v0.44: config 10 on the H100, 3 on the H200
        assert plan(harness, *gemm, c_mode=c_mode, memory_gbps=3352).config == 10
        assert plan(harness, *gemm, c_mode=c_mode, memory_gbps=4915).config == 3
        return
    p = plan(harness, *gemm, c_mode=c_mode)
    assert p.config == config, p

# v0.44: v0.40's pingpong_waves clause (config 3 where its 128x128 waves cost less than the
# 128x192 tile's) only from 4.5 TB/s of peak DRAM bandwidth. The six GEMMs it takes in the shape
# set (Qwen2-7B's 4096 x 3584 outputs), forward and dgrad layouts; H100 SXM 3352 GB/s, H200 4915.
PINGPONG_WAVES_GEMMS = [
    ("fwd", 4096, 3584, 3584), ("fwd", 4096, 3584, 8192), ("fwd", 4096, 3584, 18944),
    ("dgrad", 4096, 3584, 3584), ("dgrad", 4096, 3584, 8192), ("dgrad", 4096, 3584, 18944),
]


@pytest.mark.parametrize("gemm", PINGPONG_WAVES_GEMMS, ids=lambda g: f"{g[0]}-{g[1]}x{g[2]}x{g[3]}")
def test_v044_pingpong_waves_on_the_h200_only(harness, gemm):
    op, m, n, k = gemm
    h100 = plan(harness, op, m, n, k, memory_gbps=3352)
    assert (h100.config, h100.transposed) == (10, False), h100  # the 128x192 tile, 2x1 cluster
    assert h100.config == h100.rule[0]
    for gbps in (4915, 4500, 0):  # the H200, the threshold, unknown
        p = plan(harness, op, m, n, k, memory_gbps=gbps)
        assert (p.config, p.swizzle, p.splits, p.transposed) == (3, 0, 0, False), (gbps, p)
    assert plan(harness, op, m, n, k, memory_gbps=4499).config == 10


def test_v044_leaves_every_other_plan_of_the_shape_set_alone(harness):
    """The bandwidth changes no plan but pingpong_waves': every GEMM of the shape set (three
    layouts, every token count) plans alike at 3352 and 4915 GB/s except the six above."""
    from cutlass_nn import transformer_shapes

    moved = set()
    for tokens, n, k in transformer_shapes.parse_shape_set("transformer"):
        for op, gm, gn, gk in (("fwd", tokens, n, k), ("dgrad", tokens, k, n), ("wgrad", n, k, tokens)):
            if plan(harness, op, gm, gn, gk, memory_gbps=3352) != plan(harness, op, gm, gn, gk, memory_gbps=4915):
                moved.add((op, gm, gn, gk))
    assert moved == set(PINGPONG_WAVES_GEMMS)


def _wave_use(m: int, n: int, rows: int, cols: int, sms: int = SMS) -> float:
    """D's share of the tile turns of the waves a rows x cols tile needs (no cluster, swizzle 1)."""
    tiles = -(-m // rows) * -(-n // cols)
    return m * n / (-(-tiles // sms) * sms * rows * cols)


WHOLE_WAVE_TILES = {17: (128, 96), 18: (192, 96), 19: (192, 128)}


@pytest.mark.parametrize("case", [
    ("wgrad", 3072, 1024, 4096, 19),  # 16 x 8 = 128 tiles of 192x128 (96 of 256x128 before)
    ("wgrad", 3072, 768, 4096, 18),  # 16 x 8 = 128 of 192x96 (144 of 128x128, stream-K before)
    ("wgrad", 768, 3072, 4096, 18),  # 4 x 32 = 128
    ("fwd", 512, 3072, 1024, 17),  # 4 x 32 = 128 of 128x96 (192 transposed 64x128 before)
    ("dgrad", 512, 3072, 768, 17),
], ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}x{c[3]}")
def test_whole_waves_tiles_where_they_fill_the_waves(harness, case):
    op, m, n, k, config = case
    got = plan(harness, op, m, n, k)
    assert (got.config, got.swizzle, got.splits, got.transposed) == (config, 1, 0, False), got
    assert _wave_use(m, n, *WHOLE_WAVE_TILES[config]) >= 0.88
    assert got.kernel.endswith(f"_noc_{WHOLE_WAVE_TILES[config][0]}x{WHOLE_WAVE_TILES[config][1]}"
                               "x64_1x1x1_pingpong"), got


def test_whole_waves_tiles_stay_in_their_domain(harness):
    def cfg(op, m, n, k, **kw):
        return plan(harness, op, m, n, k, **kw).config

    # float32 outputs (an fp32 main gradient) and fused epilogues: no 16-bit-only tile
    assert cfg("wgrad", 3072, 1024, 4096, out_f32=True) not in WHOLE_WAVE_TILES
    assert cfg("fwd", 512, 3072, 1024, fused=True) not in WHOLE_WAVE_TILES
    # stream-K over K > 4096 evens out its own waves: kept
    assert cfg("wgrad", 3072, 768, 16384) == 2
    # K outside 512..16384, and the small-M transposed problem, keep the rule's tiles
    assert cfg("wgrad", 3072, 1024, 256) not in WHOLE_WAVE_TILES
    assert cfg("fwd", 128, 3072, 1024) not in WHOLE_WAVE_TILES
    # a large problem whose tiles already fill their waves: untouched
    assert cfg("fwd", 4096, 4096, 4096) == 0
    # wherever the rule takes one of the three, that tile fills its waves at least 88%
    for op in ("fwd", "dgrad", "wgrad"):
        for m in (512, 1024, 2048, 2816, 3072, 4096):
            for n in (768, 1024, 2816, 3072, 4096):
                got = plan(harness, op, m, n, 2048)
                if got.config in WHOLE_WAVE_TILES:
                    assert _wave_use(m, n, *WHOLE_WAVE_TILES[got.config]) >= 0.88, (op, m, n, got)
