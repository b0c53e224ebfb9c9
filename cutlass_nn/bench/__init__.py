"""``python -m cutlass_nn.bench``: cutlass_nn kernels against PyTorch (cuBLAS / ATen) on one GPU.

Usage::

    python -m cutlass_nn.bench [--quick] [--out DIR] [--dtypes bf16,fp16,fp32]
                               [--what fwd,sm80,dgrad,wgrad,fwdbwd,linact,add2,fp32]
                               [--budget-ms MS] [--time-limit S]
    python -m cutlass_nn.bench --what models [...]   # whole-model training steps (bench_models)
    python -m cutlass_nn.bench --what host [...]     # host time per call (bench_host)
    python -m cutlass_nn.bench --what step-sweep [...]  # each GEMM configuration inside a step
    python -m cutlass_nn.bench --sweep [--sweep-shapes MxNxK,...] [--sweep-swizzles 1,4]
                               [--sweep-splits 0,1,2,4] [--what fwd,dgrad,wgrad]
                               [--budget-ms MS] [--out DIR]

Each row is one problem (an operation, a precision, a shape) timed twice in the same process:
"ours" (the cutlass_nn operator) and "base" (the PyTorch expression it replaces). Method, in the
order it happens (benchmarks/README.md says why):

1. Correctness first: ours and base run once on random inputs; both are compared with a float64
   reference on a sampled submatrix (up to 256 x 256 output elements); ours passes when
   ``err(ours) <= 2 * err(torch) + floor`` and its whole output is finite (the allocator is
   poisoned with NaN first, so unwritten elements show). A failing row is marked FAIL and NOT
   timed.
2. Warm-up, then repetitions; each repetition is ``torch.cuda.synchronize()`` (barrier), a short
   GPU sleep kernel (so the host can queue the whole repetition: launch and Python overhead are not
   timed), then ours and base, each between two CUDA events. The order alternates every
   repetition. Inputs rotate among several random input sets when one set would fit in L2.
3. Median, p10 and p90 of each side; rate (TFLOP/s with 2*M*N*K per GEMM, or GB/s with 2 reads +
   1 write for add2); ratio = base median / ours median (> 1: ours is faster); fraction of the
   device peaks measured at the start (torch.mm 8192^3 per precision, device-to-device copy).

Any exception in a row is caught, printed and recorded in the JSON, and the run goes on. Results:
a JSON file (device, versions, date, command, peaks, every row) rewritten after each row, a PNG
plot, and a compact table printed last, then the summary with the issue's targets (PASS / MISS).

``--sweep`` forces each SM90 tile configuration (``torch.ops.cutlass_nn._set_gemm_config``) with
each swizzle asked for (and, for the stream-K ones, each split-K count asked for), checks it like a
row, then times all that passed and the baseline in the
same interleaved repetitions; it writes ``sweep_*.json`` and prints the best per shape and op.

Exit codes: 0 every row ok (or skipped), 3 the run finished but some rows are FAIL / error
(--sweep: the automatic rule's own configuration failed somewhere; a forced configuration that
cannot run a shape is expected), 2 no CUDA device or no CUDA kernels (or bad arguments, or no
configuration override for --sweep), 130 interrupted.


The package: ``spec``, ``stats``, ``plan``, ``correctness``, ``cases``, ``timing``, ``rows``, ``sweep``, ``report``, ``cli`` (one job each, see each
module's docstring; ``cli``'s option parsers live in ``arg_types``), ``models`` (whole-model steps, ``--what models``; its summary, table and
plot in ``models_report``, what else ran in a timed block in ``block_probe``, where a side's
kept memory was allocated in ``memory_trace``, whether the models' attention gets a mask eager
and compiled in ``attention_probe``), ``host`` (host time
per call, ``--what host``), ``step_profile`` (where a step's GPU time goes) and ``step_sweep``
(each GEMM configuration timed inside a compiled step, ``--what step-sweep``). Every name of the first ten is re-exported here, so
``from cutlass_nn import bench; bench.main()`` and the tests' ``bench.X`` keep working.
"""

from __future__ import annotations

import torch

import cutlass_nn
from cutlass_nn import ops, transformer_shapes
from cutlass_nn.bench import spec
from cutlass_nn.bench.spec import (  # noqa: F401
    ADD2_OPS,
    ADD2_SIZES,
    AUTO_CONFIG,
    DEFAULT_L2_BYTES,
    DTYPE_CHOICES,
    EAGER_CALLS,
    FP32_QUICK_SHAPES,
    FP32_SHAPES,
    FULL,
    GEMM_OPS,
    GEMM_SHAPES,
    LINACT_ACTIVATION,
    LINACT_ACTIVATIONS,
    LINACT_ALL_OPS,
    LINACT_MLP_SHAPES,
    LINACT_OPS,
    LINACT_QUICK_SHAPES,
    LINACT_SETS,
    LINACT_SHAPES,
    OP_TITLES,
    PRECISIONS,
    PRECISION_ORDER,
    Precision,
    QUICK,
    QUICK_SHAPES,
    REF_CHUNK_ELEMENTS,
    SAMPLE,
    SMALL_M,
    SWEEP,
    SWEEP_OPS,
    SWEEP_SPLITS,
    SWEEP_SWIZZLES,
    Settings,
    SkipRow,
    WHAT_ITEMS,
    linact_op,
    scale_settings,
    split_linact_op,
)
from cutlass_nn.bench import stats
from cutlass_nn.bench.stats import (  # noqa: F401
    _first_line,
    _fmt,
    _fmt_err,
    _good_ratio,
    _max_or_nan,
    add2_bytes,
    add2_memory_bytes,
    gemm_flops,
    gemm_input_bytes,
    gemm_memory_bytes,
    geomean,
    linact_input_bytes,
    linact_memory_bytes,
    median_ci95,
    paired_ratio_spread,
    percentile,
    rate,
    rotation_sets,
    time_stats,
    worst_errors,
)
from cutlass_nn.bench import plan
from cutlass_nn.bench.plan import (  # noqa: F401
    RowSpec,
    plan_rows,
)
from cutlass_nn.bench import correctness
from cutlass_nn.bench.correctness import (  # noqa: F401
    compare_outputs,
    poison,
    rel_err,
    sample_index,
    sampled_mm,
    take,
)
from cutlass_nn.bench import cases
from cutlass_nn.bench.cases import (  # noqa: F401
    Case,
    _fwdbwd_case,
    build_add2_case,
    build_case,
    build_gemm_case,
    build_linact_case,
    compile_baseline,
    guard_memory,
    linact_reference,
    make_linact_module,
    precision_context,
    row_context,
)
from cutlass_nn.bench import timing
from cutlass_nn.bench.timing import (  # noqa: F401
    CudaTimer,
    Timer,
    release_memory,
)
from cutlass_nn.bench import rows
from cutlass_nn.bench.rows import (  # noqa: F401
    cuda_healthy,
    fill_eager,
    fill_timing,
    measure_peaks,
    peak_for,
    run_plan,
    run_row,
)
from cutlass_nn.bench import sweep
from cutlass_nn.bench.sweep import (  # noqa: F401
    ConfigSetter,
    SetConfig,
    _STATUS_CELL,
    _schema_takes_splits,
    _too_many_arguments,
    _with_config,
    finish_sweep_entries,
    format_sweep_best,
    format_sweep_progress,
    format_sweep_table,
    gemm_config_api,
    is_stream_k,
    parse_config_names,
    run_sweep_group,
    sweep_best,
    sweep_plan,
    sweep_variants,
    variant_key,
)
from cutlass_nn.bench import report
from cutlass_nn.bench.report import (  # noqa: F401
    TARGETS,
    Target,
    _cell,
    _format_linact_mlp,
    describe,
    evaluate_targets,
    format_fp32_errors,
    format_progress,
    format_summary,
    format_tables,
    format_targets,
    plot_results,
    summarize,
    to_jsonable,
    write_json,
)
from cutlass_nn.bench import cli
from cutlass_nn.bench.cli import (  # noqa: F401
    NO_CUDA_MESSAGE,
    csv_choices,
    _delegated_what,
    _git_commit,
    _memory_gbps,
    _names_transformer,
    _planned_rows,
    _plot_title,
    _slug,
    _stamp,
    build_sweep_case,
    collect_meta,
    gpu_run_meta,
    main,
    mode_settings,
    parse_args,
    parse_shapes,
    parse_splits,
    parse_swizzles,
    positive_float,
    replot,
    sweep_main,
)

#: The submodules whose names are re-exported (tests patch a name in each that holds it).
MODULES = (spec, stats, plan, correctness, cases, timing, rows, sweep, report, cli)
