#include "gemm_autotune.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

namespace cutlass_nn {
namespace cuda {
namespace {

using kernels::DType;
using kernels::GemmParams;
using kernels::GemmPlan;
using kernels::Layout;

// Problems with less work (m * n * k) are not tuned: they take a few microseconds, the host
// dominates, and the rule's choice is as good as any.
constexpr double kMinTuneWork = double(1 << 24);
// The rule's choice is kept unless a candidate beats it by more than this (timing noise).
constexpr double kKeepRuleMargin = 1.01;

// [device, m, n, k, layout_a, layout_b, dtype_ab, dtype_cd, bias, accumulate]
using TuneKey = std::array<int64_t, 10>;

struct TuneKeyHash {
  size_t operator()(const TuneKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the 64-bit words
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

// A configuration as the plan resolved it (the overrides that reproduce the plan).
struct Choice {
  int config = -1, swizzle = 0, splits = 0;
  bool transposed = false;
};

struct Entry {
  Choice chosen, rule;
  int candidates = 0;  // configurations timed (after removing those that resolve alike)
  double best_us = 0, rule_us = 0;
  const char* kernel = "";  // registry name of the chosen kernel ("" for loaded entries)
};

std::atomic<bool> g_first_call{false};
std::atomic<int64_t> g_entry_count{0};
std::shared_mutex g_table_mutex;                        // guards g_table and g_failed
std::unordered_map<TuneKey, Entry, TuneKeyHash> g_table;  // never shrinks except by clear
// Problems whose tuning failed (out of memory, a CUDA error): run the rule, never retried until
// clear(), so a failure costs one attempt, not one per call.
std::unordered_map<TuneKey, bool, TuneKeyHash> g_failed;
// One tuning run at a time per device (a run synchronizes the device's stream; a lock shared by
// all devices could make one device's thread wait on another's stream).
constexpr int kTuneLocks = 64;
std::mutex g_tune_mutex[kTuneLocks];

bool is_16bit(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

bool eligible(const GemmParams& p) {
  if (p.sm != 90 || p.arch_path != kernels::ArchPath::kAuto || !is_16bit(p.dtype_ab)) {
    return false;
  }
  if (kernels::has_fused_epilogue(p) || p.d_column_major || p.alpha != 1.0f) return false;
  if (p.sm90_config >= 0 || p.swizzle > 0 || p.splits != 0) return false;  // forced (sweep)
  if (p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX) return false;
  return double(p.m) * double(p.n) * double(p.k) >= kMinTuneWork;
}

bool has_bias(const GemmParams& p) {
  return p.c != nullptr && p.beta != 0.0f && p.c_row_broadcast;
}
bool accumulates(const GemmParams& p) {
  return p.c != nullptr && p.beta != 0.0f && !p.c_row_broadcast;
}

TuneKey key_of(const GemmParams& p, int device) {
  return TuneKey{device,
                 p.m,
                 p.n,
                 p.k,
                 static_cast<int64_t>(p.layout_a),
                 static_cast<int64_t>(p.layout_b),
                 static_cast<int64_t>(p.dtype_ab),
                 static_cast<int64_t>(p.dtype_cd),
                 has_bias(p),
                 accumulates(p)};
}

std::optional<Entry> lookup(const TuneKey& key) {
  std::shared_lock<std::shared_mutex> lock(g_table_mutex);
  const auto it = g_table.find(key);
  if (it == g_table.end()) return std::nullopt;
  return it->second;
}

void insert(const TuneKey& key, const Entry& entry) {
  std::unique_lock<std::shared_mutex> lock(g_table_mutex);
  g_table[key] = entry;
  g_entry_count.store(static_cast<int64_t>(g_table.size()));
}

bool failed_before(const TuneKey& key) {
  std::shared_lock<std::shared_mutex> lock(g_table_mutex);
  return g_failed.count(key) != 0;
}

void mark_failed(const TuneKey& key) {
  std::unique_lock<std::shared_mutex> lock(g_table_mutex);
  g_failed[key] = true;
}

void apply(const Choice& c, GemmParams& p) {
  p.sm90_config = c.config;
  p.swizzle = c.swizzle;
  p.splits = c.splits;
}

// Whether tuning must not run now: the stream is being captured (or its state is unknown), or
// a CUDA error is already pending (it belongs to the caller; tuning neither clears nor hides it).
bool must_not_tune(cudaStream_t stream) {
  if (cudaPeekAtLastError() != cudaSuccess) return true;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) return true;
  return status != cudaStreamCaptureStatusNone;
}

at::ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat64: return at::kDouble;
  }
  return at::kFloat;
}

// A [rows, cols] matrix of fixed values spread over [-1, 1) (the fractional parts of i * 0.618...,
// a low-discrepancy sequence): tuning must not draw from torch's random generators, or a tuned
// run would see different dropout masks than an untuned one.
at::Tensor filled(int64_t rows, int64_t cols, at::ScalarType dtype, const at::Tensor& like) {
  const auto opts = like.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
  at::Tensor t = at::arange(rows * cols, opts).mul_(0.6180339887f).frac_().mul_(2.0f).sub_(1.0f);
  return t.view({rows, cols}).to(dtype);
}

// The problem's operands, in the layouts of the key, densely packed.
struct Buffers {
  at::Tensor a, b, bias, d, reference;
  at::Tensor d_initial;  // the D that an accumulating candidate starts from (nonzero)
  // Copies of A and B (index 0: a and b themselves) that the timed runs rotate through, so
  // that each run reads operands the run before did not leave in L2 (cold_operand_copies).
  std::vector<at::Tensor> a_copies, b_copies;
};

// How many copies of the operands the timed runs rotate through: enough that one pass over them
// moves at least twice the L2's size, at most kMaxOperandCopies (operands under 1/16 of the L2
// stay partly cached; an accumulated D, which is also C, is not rotated). Inside a training step
// a GEMM's operands mostly come from HBM, and the configurations need not gain alike from a warm
// L2: a 128x128 tile reads a third more operand bytes per output than a 128x256 one. (The tuner
// on one warm pair timed the k/v projections, whose operands fit the L2, 15-17% faster than the
// step ran them: benchmarks/NOTES.md, session 31.)
constexpr int kMaxOperandCopies = 32;

int cold_operand_copies(const Buffers& buf, int device) {
  int l2_bytes = 0;
  if (cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  const double pair = double(buf.a.nbytes()) + double(buf.b.nbytes());
  if (pair <= 0 || l2_bytes <= 0) return 1;
  const double wanted = std::ceil(2.0 * double(l2_bytes) / pair);
  return wanted >= kMaxOperandCopies ? kMaxOperandCopies : std::max(1, static_cast<int>(wanted));
}

// Fills buf.a_copies / b_copies: the operands and up to copies - 1 clones (fewer where memory is
// short: then the runs rotate through what fits, warm as before at one pair).
void make_operand_copies(Buffers& buf, int copies) {
  buf.a_copies = {buf.a};
  buf.b_copies = {buf.b};
  for (int i = 1; i < copies; ++i) {
    try {
      at::Tensor a = buf.a.clone();
      at::Tensor b = buf.b.clone();
      buf.a_copies.push_back(std::move(a));
      buf.b_copies.push_back(std::move(b));
    } catch (const c10::OutOfMemoryError&) {
      break;
    }
  }
}

GemmParams tuning_params(const GemmParams& like_p, Buffers& buf, const at::Tensor& like) {
  GemmParams p = like_p;
  const int64_t m = p.m, n = p.n, k = p.k;
  const at::ScalarType ab = scalar_type(p.dtype_ab), cd = scalar_type(p.dtype_cd);
  const bool a_row = p.layout_a == Layout::kRowMajor, b_row = p.layout_b == Layout::kRowMajor;
  buf.a = a_row ? filled(m, k, ab, like) : filled(k, m, ab, like);
  buf.b = b_row ? filled(k, n, ab, like) : filled(n, k, ab, like);
  buf.d = at::zeros({m, n}, like.options().dtype(cd).memory_format(at::MemoryFormat::Contiguous));
  p.a = buf.a.data_ptr();
  p.lda = a_row ? k : m;
  p.b = buf.b.data_ptr();
  p.ldb = b_row ? n : k;
  p.d = buf.d.data_ptr();
  p.ldd = n;
  p.alpha = 1.0f;
  if (has_bias(like_p)) {
    buf.bias = filled(1, n, cd, like).view({n});
    p.c = buf.bias.data_ptr();
    p.ldc = 0;
    p.c_row_broadcast = true;
    p.beta = 1.0f;
  } else if (accumulates(like_p)) {
    buf.d_initial = filled(m, n, cd, like);
    buf.d.copy_(buf.d_initial);
    p.c = p.d;
    p.ldc = p.ldd;
    p.c_row_broadcast = false;
    p.beta = 1.0f;
  } else {
    p.c = nullptr;
    p.ldc = 0;
    p.c_row_broadcast = false;
    p.beta = 0.0f;
  }
  p.sm90_config = -1;
  p.swizzle = 0;
  p.splits = 0;
  return p;
}

// Events of one tuning run, destroyed with it.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  bool ok = false;
  EventPair() {
    ok = cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess;
  }
  ~EventPair() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
};

bool run(const GemmPlan& plan, const at::Tensor& workspace, cudaStream_t stream) {
  void* ws = plan.workspace_bytes > 0 ? workspace.data_ptr() : nullptr;
  return kernels::run_gemm_plan(plan, ws, plan.workspace_bytes, stream, nullptr) ==
         kernels::GemmStatus::kSuccess;
}

// The plan on copy `i` of the operands. The plan's A and B may be the problem's B and A (a
// transposed kernel), so each pointer is mapped by which operand it is.
GemmPlan on_copy(const GemmPlan& plan, const Buffers& buf, size_t i) {
  GemmPlan q = plan;
  const size_t j = i % buf.a_copies.size();
  if (j == 0) return q;
  auto map = [&](const void* ptr) -> const void* {
    if (ptr == buf.a.data_ptr()) return buf.a_copies[j].data_ptr();
    if (ptr == buf.b.data_ptr()) return buf.b_copies[j].data_ptr();
    return ptr;
  };
  q.params.a = map(q.params.a);
  q.params.b = map(q.params.b);
  return q;
}

// Mean time in milliseconds of one run within a batch of `reps` back-to-back runs, each on the
// next copy of the operands (continuing from *next_copy), or a negative value if a run failed.
double batch_ms(const GemmPlan& plan, const Buffers& buf, const at::Tensor& workspace,
                cudaStream_t stream, EventPair& ev, int reps, size_t* next_copy) {
  if (cudaEventRecord(ev.start, stream) != cudaSuccess) return -1;
  for (int i = 0; i < reps; ++i) {
    if (!run(on_copy(plan, buf, (*next_copy)++), workspace, stream)) return -1;
  }
  float ms = 0;
  if (cudaEventRecord(ev.stop, stream) != cudaSuccess ||
      cudaEventSynchronize(ev.stop) != cudaSuccess ||
      cudaEventElapsedTime(&ms, ev.start, ev.stop) != cudaSuccess) {
    return -1;
  }
  return double(ms) / reps;
}

// Runs per timed batch of a plan (a batch of about a millisecond, 3..200 runs) after two warm-up
// runs, or a negative value if a run failed.
int batch_reps(const GemmPlan& plan, const Buffers& buf, const at::Tensor& workspace,
               cudaStream_t stream, EventPair& ev, size_t* next_copy) {
  for (int i = 0; i < 2; ++i) {
    if (!run(on_copy(plan, buf, (*next_copy)++), workspace, stream)) return -1;
  }
  const double estimate = batch_ms(plan, buf, workspace, stream, ev, 3, next_copy);
  if (estimate < 0) return -1;
  const int reps = estimate > 0 ? static_cast<int>(1.0 / estimate) : 200;
  return reps < 3 ? 3 : (reps > 200 ? 200 : reps);
}

// Timed rounds: each round times every candidate once (one batch), starting one candidate later
// than the round before; a candidate's time is its best batch. Interleaving matters: timed one
// after another, the first candidates (the rule's first of all) ran while the GPU's clock was
// still rising at the model's first step and looked up to ~20% slower than the same kernels
// timed later (benchmarks/NOTES.md v0.21).
constexpr int kTimedRounds = 5;

// The candidates: (config, splits, swizzle). The rule's own choice runs first (its result is
// the reference the others are checked against); candidates whose plan resolves to one already
// taken (a configuration without a kernel for this layout falls back to the rule) are skipped.
// The persistent tile configurations run with the scheduler's default order (swizzle 1) and with
// a swizzle of 2 (neighbouring CTAs share operand tiles): the rule gives several of them a
// swizzle of 2, and a forced configuration otherwise runs with the default only (config 13 on
// small weight gradients ran up to 26% faster with 2, benchmarks/NOTES.md v0.29).
constexpr std::array<std::array<int, 3>, 32> kCandidates = {{
    {-1, 0, 0},                                    // the rule
    {0, 0, 1}, {0, 0, 2},                          // 128x256, 2x1 cluster
    {1, 0, 1}, {1, 0, 2},                          // 128x192, no cluster
    {2, 0, 0}, {2, 1, 0}, {2, 2, 0}, {2, 3, 0}, {2, 4, 0},  // 128x128 stream-K / DP / split-K
    {3, 0, 1}, {3, 0, 2},                          // 128x128 ping-pong, 1x2 cluster
    {4, 0, 0}, {5, 0, 0}, {6, 0, 0}, {7, 0, 0},    // transposed small-M tiles
    {8, 0, 0}, {9, 0, 0},                          // short-K weight gradient
    {10, 0, 1}, {10, 0, 2},                        // 128x192, 2x1 cluster
    {11, 0, 0}, {12, 0, 0},                        // small weight gradient, whole K
    {13, 0, 1}, {13, 0, 2},                        // 64x128 ping-pong
    {14, 0, 1}, {14, 0, 2},                        // 256x128, 1x2 cluster
    {15, 0, 1}, {15, 0, 2},                        // 128x128 ping-pong, no cluster
    {16, 0, 0},                                    // transposed 64-token tile, 64-deep k-blocks
    {17, 0, 1}, {18, 0, 1}, {19, 0, 1},            // 128x96, 192x96, 192x128 ping-pong (v0.49)
}};

// Swizzles 0 and 1 are the same order (CUTLASS's default).
int effective_swizzle(int swizzle) { return swizzle <= 1 ? 1 : swizzle; }

bool same_output(const at::Tensor& d, const at::Tensor& reference) {
  const at::Tensor ref = reference.to(at::kFloat);
  const double scale = ref.abs().max().item<double>();
  const double diff = (d.to(at::kFloat) - ref).abs().max().item<double>();
  return diff <= 0.02 * scale + 1e-3;  // NaN fails
}

// Times every candidate on buffers of the problem's shape; nullopt when the rule's own plan
// cannot run (nothing to compare with) or a CUDA call failed.
std::optional<Entry> tune(const GemmParams& like_p, const at::Tensor& like, cudaStream_t stream) {
  Buffers buf;
  const GemmParams base = tuning_params(like_p, buf, like);
  // No CUDA error was pending when tuning began (must_not_tune), so one now is the tuning's
  // own: cleared when it is not sticky; a sticky one stays and surfaces at the caller's GEMM.
  auto abandon = []() -> std::optional<Entry> {
    (void)cudaGetLastError();
    return std::nullopt;
  };
  EventPair events;
  if (!events.ok) return abandon();
  const bool accumulate = accumulates(like_p);
  // Every distinct kernel + choice tried so far (candidates that resolve to the same kernel with
  // the same settings are tried once).
  struct Tried {
    const void* kernel;
    Choice choice;
  };
  std::vector<Tried> tried;
  // The candidates that ran and matched the rule's result, timed after all are checked.
  constexpr double kNotTimed = std::numeric_limits<double>::infinity();
  constexpr double kFailed = -1.0;
  struct Candidate {
    GemmPlan plan;  // plan.name: the registry's name (static storage)
    Choice choice;
    at::Tensor workspace;
    bool is_rule;
    int reps;
    double best_ms;
  };
  std::vector<Candidate> timed;
  Entry entry;
  double best_us = std::numeric_limits<double>::infinity();
  for (const auto& cand : kCandidates) {
    GemmParams q = base;
    q.sm90_config = cand[0];
    q.splits = cand[1];
    q.swizzle = cand[2];
    const GemmPlan plan = kernels::plan_gemm(q);
    if (plan.kernel == nullptr) {
      if (cand[0] < 0) return std::nullopt;
      continue;
    }
    // The rule's batched split-K (the long-K weight gradients with few output tiles) is not
    // tuned: none of the candidates splits that way, so the rule's plan stays.
    if (plan.k_slices > 1) {
      if (cand[0] < 0) return std::nullopt;
      continue;
    }
    const std::string name = plan.name;
    const bool is_rule = cand[0] < 0;
    if (!is_rule && name.rfind("sm90", 0) != 0) continue;  // no SM90 kernel: not a candidate
    Choice c{plan.params.sm90_config, plan.params.swizzle, plan.params.splits,
             plan.params.d_column_major};
    bool duplicate = false;
    for (const Tried& t : tried) {
      duplicate = duplicate || (t.kernel == plan.kernel && t.choice.transposed == c.transposed &&
                                t.choice.splits == c.splits &&
                                effective_swizzle(t.choice.swizzle) == effective_swizzle(c.swizzle));
    }
    if (duplicate) continue;
    tried.push_back({plan.kernel, c});
    at::Tensor workspace;
    if (plan.workspace_bytes > 0) {
      workspace = at::empty({static_cast<int64_t>(plan.workspace_bytes)},
                            like.options().dtype(at::kByte));
    }
    // One run (an accumulating one from the same nonzero D each time), checked against the
    // rule's result. A status error without a CUDA error (the kernel refused the problem) skips
    // the candidate; a CUDA error ends the tuning (the problem then runs the rule's choice).
    if (accumulate) buf.d.copy_(buf.d_initial);
    if (!run(plan, workspace, stream)) {
      if (is_rule || cudaPeekAtLastError() != cudaSuccess) return abandon();
      continue;
    }
    if (is_rule) {
      buf.reference = buf.d.clone();
    } else if (!same_output(buf.d, buf.reference)) {
      continue;  // a configuration that is wrong at this shape is never chosen
    }
    timed.push_back({plan, c, workspace, is_rule, 0, kNotTimed});
  }
  // Warm-up and batch size of each candidate, then the interleaved rounds, every run on the next
  // copy of the operands (made after the checks, which need one copy only).
  make_operand_copies(buf, cold_operand_copies(buf, like.get_device()));
  size_t next_copy = 0;
  for (Candidate& t : timed) {
    t.reps = batch_reps(t.plan, buf, t.workspace, stream, events, &next_copy);
    if (t.reps < 0) {
      if (t.is_rule || cudaPeekAtLastError() != cudaSuccess) return abandon();
      t.best_ms = kFailed;
    }
  }
  const size_t n = timed.size();
  for (int round = 0; round < kTimedRounds; ++round) {
    for (size_t j = 0; j < n; ++j) {
      Candidate& t = timed[(j + static_cast<size_t>(round)) % n];
      if (t.best_ms == kFailed) continue;
      const double ms = batch_ms(t.plan, buf, t.workspace, stream, events, t.reps, &next_copy);
      if (ms < 0) {
        if (t.is_rule || cudaPeekAtLastError() != cudaSuccess) return abandon();
        t.best_ms = kFailed;
        continue;
      }
      if (ms < t.best_ms) t.best_ms = ms;
    }
  }
  for (const Candidate& t : timed) {
    if (t.best_ms == kFailed) continue;
    const double us = t.best_ms * 1000.0;
    ++entry.candidates;
    if (t.is_rule) {
      entry.rule = t.choice;
      entry.rule_us = us;
    }
    if (us < best_us) {
      best_us = us;
      entry.chosen = t.choice;
      entry.kernel = t.plan.name;
    }
  }
  entry.best_us = best_us;
  if (entry.rule_us <= best_us * kKeepRuleMargin) {
    // Within the noise of the rule: keep the rule's choice (and name its kernel).
    GemmParams q = base;
    entry.chosen = entry.rule;
    entry.best_us = entry.rule_us;
    entry.kernel = kernels::plan_gemm(q).name;
  }
  return entry;
}

}  // namespace

void apply_autotuned_choice(GemmParams& p, const at::Tensor& like, cudaStream_t stream) {
  const bool first_call = g_first_call.load(std::memory_order_relaxed);
  if (!first_call && g_entry_count.load(std::memory_order_relaxed) == 0) return;
  if (!eligible(p)) return;
  const TuneKey key = key_of(p, like.get_device());
  if (const auto hit = lookup(key)) {
    apply(hit->chosen, p);
    return;
  }
  if (!first_call || failed_before(key) || must_not_tune(stream)) return;
  std::lock_guard<std::mutex> tuning(g_tune_mutex[like.get_device() % kTuneLocks]);
  if (const auto hit = lookup(key)) {  // tuned by another thread meanwhile
    apply(hit->chosen, p);
    return;
  }
  if (failed_before(key)) return;
  std::optional<Entry> entry;
  try {
    entry = tune(p, like, stream);
  } catch (const c10::OutOfMemoryError&) {
    // Not enough memory for a second copy of the operands: the rule's choice, untuned.
    entry.reset();
  }
  if (!entry.has_value()) {
    mark_failed(key);
    return;
  }
  insert(key, *entry);
  apply(entry->chosen, p);
}

bool set_autotune_mode(int mode) {
  if (mode < 0) return g_first_call.load();
  return g_first_call.exchange(mode != 0);
}

std::tuple<std::vector<int64_t>, std::vector<double>, std::vector<std::string>>
autotune_entries() {
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> names;
  std::shared_lock<std::shared_mutex> lock(g_table_mutex);
  for (const auto& [key, e] : g_table) {
    ints.insert(ints.end(), key.begin(), key.end());
    const int64_t rest[] = {e.chosen.config, e.chosen.swizzle, e.chosen.splits,
                            e.chosen.transposed, e.rule.config, e.rule.swizzle,
                            e.rule.splits, e.rule.transposed, e.candidates};
    ints.insert(ints.end(), std::begin(rest), std::end(rest));
    floats.push_back(e.best_us);
    floats.push_back(e.rule_us);
    names.emplace_back(e.kernel);
  }
  return {ints, floats, names};
}

void add_autotune_entries(const std::vector<int64_t>& ints, const std::vector<double>& floats) {
  const char* op = "cutlass_nn._autotune_add_entries";
  TORCH_CHECK(ints.size() % kAutotuneIntFields == 0, op, ": argument 'ints' must hold ",
              std::to_string(kAutotuneIntFields), " values per entry, got ",
              std::to_string(ints.size()), " values");
  const size_t rows = ints.size() / kAutotuneIntFields;
  TORCH_CHECK(floats.size() == rows * kAutotuneFloatFields, op, ": argument 'floats' must hold ",
              std::to_string(kAutotuneFloatFields), " values per entry (",
              std::to_string(rows * kAutotuneFloatFields), "), got ",
              std::to_string(floats.size()));
  static const char* const kFields[kAutotuneIntFields] = {
      "device",      "m",          "n",      "k",           "layout_a",     "layout_b",
      "dtype_ab",    "dtype_cd",   "bias",   "accumulate",  "config",       "swizzle",
      "splits",      "transposed", "rule_config", "rule_swizzle", "rule_splits",
      "rule_transposed", "candidates"};
  const int64_t limits[kAutotuneIntFields][2] = {
      {0, 1 << 16}, {1, INT_MAX}, {1, INT_MAX}, {1, INT_MAX}, {0, 1}, {0, 1}, {0, 1}, {0, 2},
      {0, 1}, {0, 1}, {0, kernels::kSm90ConfigCount - 1}, {0, 8}, {0, 64}, {0, 1},
      {0, kernels::kSm90ConfigCount - 1}, {0, 8}, {0, 64}, {0, 1}, {0, 1 << 16}};
  std::vector<std::pair<TuneKey, Entry>> parsed;
  for (size_t r = 0; r < rows; ++r) {
    const int64_t* v = ints.data() + r * kAutotuneIntFields;
    for (int f = 0; f < kAutotuneIntFields; ++f) {
      TORCH_CHECK(v[f] >= limits[f][0] && v[f] <= limits[f][1], op, ": entry ", std::to_string(r),
                  ": field '", kFields[f], "' must be in [", std::to_string(limits[f][0]), ", ",
                  std::to_string(limits[f][1]), "], got ", std::to_string(v[f]));
    }
    TORCH_CHECK(v[7] == v[6] || v[7] == static_cast<int64_t>(DType::kFloat32), op, ": entry ",
                std::to_string(r), ": field 'dtype_cd' must equal 'dtype_ab' or be float32 (2), got ",
                std::to_string(v[7]));
    TORCH_CHECK(!(v[8] && v[9]), op, ": entry ", std::to_string(r),
                ": 'bias' and 'accumulate' cannot both be set");
    TORCH_CHECK(!(v[4] == 1 && v[5] == 1), op, ": entry ", std::to_string(r),
                ": no GEMM reads both operands column-major (layout_a = layout_b = 1)");
    for (int i = 0; i < kAutotuneFloatFields; ++i) {
      const double x = floats[r * kAutotuneFloatFields + i];
      TORCH_CHECK(x >= 0 && x < 1e12, op, ": entry ", std::to_string(r),
                  ": times must be finite and >= 0, got ", std::to_string(x));
    }
    TuneKey key;
    for (int f = 0; f < 10; ++f) key[f] = v[f];
    Entry e;
    e.chosen = Choice{int(v[10]), int(v[11]), int(v[12]), v[13] != 0};
    e.rule = Choice{int(v[14]), int(v[15]), int(v[16]), v[17] != 0};
    e.candidates = int(v[18]);
    e.best_us = floats[r * kAutotuneFloatFields];
    e.rule_us = floats[r * kAutotuneFloatFields + 1];
    parsed.emplace_back(key, e);
  }
  std::unique_lock<std::shared_mutex> lock(g_table_mutex);
  for (const auto& [key, e] : parsed) g_table[key] = e;
  g_entry_count.store(static_cast<int64_t>(g_table.size()));
}

int64_t clear_autotune_entries() {
  std::unique_lock<std::shared_mutex> lock(g_table_mutex);
  const int64_t n = static_cast<int64_t>(g_table.size());
  g_table.clear();
  g_failed.clear();
  g_entry_count.store(0);
  return n;
}

}  // namespace cuda
}  // namespace cutlass_nn
