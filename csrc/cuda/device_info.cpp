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
    cache[index] = DeviceInfo{major * 10 + minor, sms};
    known[index] = true;
  }
  return cache[index];
}

}  // namespace cuda
}  // namespace cutlass_nn
