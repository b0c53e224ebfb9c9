#include "device_info.h"

#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <deque>
#include <mutex>

namespace cutlass_nn {
namespace cuda {

const DeviceInfo& device_info(int index) {
  static std::mutex mutex;
  static std::deque<DeviceInfo> cache;  // deque: references stay valid as it grows
  static std::deque<bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  if (index >= static_cast<int>(cache.size())) {
    cache.resize(index + 1);
    known.resize(index + 1, false);
  }
  if (!known[index]) {
    int major = 0, minor = 0, sms = 0;
    cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index);
    TORCH_CHECK(err == cudaSuccess, "cutlass_nn: cannot read the properties of cuda:", std::to_string(index),
                ": ", cudaGetErrorString(err));
    // The bandwidth is advisory (kernel selection only): a driver that does not report the
    // memory clock or bus width leaves it 0 (unknown) instead of failing the operator.
    // A failed read's error is cleared, unless an error was already pending (the caller's).
    const bool error_pending = cudaPeekAtLastError() != cudaSuccess;
    int memory_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, index) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, index) != cudaSuccess) {
      if (!error_pending) (void)cudaGetLastError();
      memory_khz = bus_bits = 0;
    }
    // Double data rate: two transfers of bus_bits / 8 bytes per memory clock.
    const double gbps = 2.0 * double(memory_khz) * 1e3 * (double(bus_bits) / 8.0) / 1e9;
    cache[index] = DeviceInfo{major * 10 + minor, sms, static_cast<int>(gbps)};
    known[index] = true;
  }
  return cache[index];
}

}  // namespace cuda
}  // namespace cutlass_nn
