// The process-wide launch settings of launch_settings.h (one definition for every kernel unit).
#include "launch_settings.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace cutlass_nn {
namespace kernels {
namespace {

bool initial_programmatic_launch() {
  const char* value = std::getenv("CUTLASS_NN_PDL");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

std::atomic<bool>& programmatic_launch_flag() {
  static std::atomic<bool> flag{initial_programmatic_launch()};
  return flag;
}

}  // namespace

bool programmatic_launch_enabled() {
  return programmatic_launch_flag().load(std::memory_order_relaxed);
}

bool set_programmatic_launch(bool enable) { return programmatic_launch_flag().exchange(enable); }

}  // namespace kernels
}  // namespace cutlass_nn
