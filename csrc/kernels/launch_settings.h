// Process-wide launch settings of the SM90 GEMM kernels (torch-free), read on every launch.
//
// Programmatic dependent launch (PDL): an SM90 GEMM is launched with the
// cudaLaunchAttributeProgrammaticStreamSerialization attribute, so that when the kernel before it
// in the stream is one of our own SM90 GEMMs (the only kernels that signal early, with
// griddepcontrol.launch_dependents when their consumers reach their last tile), its CTAs are
// placed on the SMs that kernel frees and run their prologue (barrier set-up, cluster sync,
// descriptor prefetch) while it finishes. Correctness does not depend on the timing: every
// global-memory access of these kernels comes after griddepcontrol.wait in the producer warps
// (CUTLASS's SM90 kernels, compiled with CUTLASS_ENABLE_GDC_FOR_SM90), which returns only when
// the kernel before has completed and its writes are visible; the consumers' loads (bias, scale
// vectors) and stores (D, aux, stream-K partial sums and flags) come after their first wait on
// the mainloop pipeline, whose first stage the producers fill only after their wait. After a
// kernel that never signals (torch's, our elementwise ones), the GEMM starts only once that
// kernel has completed, and reads its results after the same wait.
//
// This rests on three facts of CUTLASS 4.2 and of our arguments (re-check them when either
// changes; benchmarks/NOTES.md v0.21 has the review): every work tile has at least one k-tile
// (K >= 1 is checked before any SM90 kernel runs: a tile without k-tiles would reach its
// epilogue without waiting); the epilogues' alpha / beta are values, never device pointers
// (Sm90ScalarBroadcast reads a pointer in its constructor, before any wait); CUTLASS's stream-K
// "separate reduction" units, which skip the mainloop, are disabled in this version.
#pragma once

namespace cutlass_nn {
namespace kernels {

// Whether SM90 GEMMs are launched with PDL. The initial value comes from the environment
// variable CUTLASS_NN_PDL ("0" turns it off; anything else, or unset, leaves it on).
bool programmatic_launch_enabled();

// Sets it (process-wide, all devices); returns the previous value.
bool set_programmatic_launch(bool enable);

}  // namespace kernels
}  // namespace cutlass_nn
