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
// the kernel before has completed and its writes are visible; the consumers' stores follow data
// the producers loaded after it. After any other kernel, or a copy, the launch is serialized as
// usual (the attribute only relaxes the dependency on a kernel that asks for the overlap).
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
