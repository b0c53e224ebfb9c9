// Cached per-device properties that kernel selection needs.
#pragma once

namespace cutlass_nn {
namespace cuda {

struct DeviceInfo {
  int sm = 0;               // compute capability, major * 10 + minor
  int multiprocessors = 0;  // SM count
  int memory_gbps = 0;      // peak DRAM bandwidth in GB/s (0 when the driver does not say)
};

// Properties of CUDA device `index`, read once per device (thread-safe).
const DeviceInfo& device_info(int index);

}  // namespace cuda
}  // namespace cutlass_nn
