// The main-gradient registry of csrc/autograd/main_grad_registry.h.
#include "main_grad_registry.h"

#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace cutlass_nn {
namespace {

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct Entry {
  // Weak, both: the weight's lifetime is the model's, and the buffer lives as long as whoever
  // holds it (the parameter's main_grad attribute), so a dropped model frees its buffers. While
  // the entry exists the weight's TensorImpl object is not freed (a weak reference keeps it,
  // not its storage), so its address cannot name another tensor.
  WeakImpl weight;
  WeakImpl buffer;
};

std::mutex g_mutex;
std::unordered_map<const c10::TensorImpl*, Entry> g_entries;
std::atomic<size_t> g_count{0};

void drop_dead_entries() {
  for (auto it = g_entries.begin(); it != g_entries.end();) {
    const bool dead = it->second.weight.expired() || it->second.buffer.expired();
    it = dead ? g_entries.erase(it) : std::next(it);
  }
}

}  // namespace

void set_main_grad(const at::Tensor& weight, const at::Tensor& buffer) {
  std::lock_guard<std::mutex> lock(g_mutex);
  drop_dead_entries();
  const c10::TensorImpl* key = weight.unsafeGetTensorImpl();
  if (buffer.defined()) {
    g_entries.insert_or_assign(
        key, Entry{WeakImpl(weight.getIntrusivePtr()), WeakImpl(buffer.getIntrusivePtr())});
  } else {
    g_entries.erase(key);
  }
  g_count.store(g_entries.size());
}

at::Tensor main_grad_of(const at::Tensor& weight) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_entries.find(weight.unsafeGetTensorImpl());
  if (it == g_entries.end()) return at::Tensor();
  auto buffer = it->second.buffer.lock();
  if (!buffer || it->second.weight.expired()) {
    g_entries.erase(it);
    g_count.store(g_entries.size());
    return at::Tensor();
  }
  return at::Tensor(std::move(buffer));
}

bool any_main_grads() { return g_count.load(std::memory_order_relaxed) != 0; }

}  // namespace cutlass_nn
