// Autotuning of the dense forward: candidates compiled in parallel, timed with CUDA events on
// the caller's tensors, the choice kept in memory and in the cache directory.
#include "autotune.h"

#include <strings.h>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "fajit/jit/cache.h"
#include "fajit/jit/key.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"

namespace fa {

std::string to_string(const TuneRecord& r) {
  auto brief = [](const KernelSpec& s) {
    return fmt::format("{} {}x{}w{}s{}", s.family == KernelFamily::kWgmma ? "wgmma" : "mma", s.tile.block_m,
                       s.tile.block_n, s.tile.warps, s.tile.stages);
  };
  const char* origin = r.origin == TuneRecord::Origin::kTuned    ? "tuned"
                       : r.origin == TuneRecord::Origin::kStored ? "stored"
                                                                 : "default";
  std::string detail;
  if (r.origin == TuneRecord::Origin::kTuned) {
    for (const auto& [spec, ms] : r.timed) detail += fmt::format("{} {:.3f} ms, ", brief(spec), ms);
    detail += fmt::format("compile {:.2f} s, {} at the call, timing {:.2f} s", r.compile_s,
                          r.compiled_at_call, r.time_s);
  } else if (r.origin == TuneRecord::Origin::kSkipped) {
    detail = "not timed: " + r.note;
  }
  return fmt::format("{}: {} {}{} on {}", r.shape_class, origin, brief(r.chosen),
                     detail.empty() ? "" : " (" + detail + ")", r.device);
}

}  // namespace fa

namespace fa::detail {

namespace {

// The timing budget of one shape class (warm-up launches included).
constexpr double kBudgetMs = 200.0;
// Launches per candidate and round at most (two rounds; a short kernel needs no more).
constexpr int kMaxReps = 20;
// Another candidate replaces the default only when it is this much faster.
constexpr double kMinGain = 1.02;

int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

bool debug() { return jit::env_flag("FAJIT_DEBUG"); }

// CUDA events around launches on one stream.
class EventTimer {
 public:
  explicit EventTimer(CUstream stream) : stream_(stream) {
    FA_CU(cuEventCreate, &start_, CU_EVENT_DEFAULT);
    try {
      FA_CU(cuEventCreate, &stop_, CU_EVENT_DEFAULT);
    } catch (...) {
      rt::driver().cuEventDestroy(start_);
      throw;
    }
  }
  ~EventTimer() {
    rt::driver().cuEventDestroy(start_);
    rt::driver().cuEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  // Milliseconds per call of `body`, over `reps` calls.
  template <typename F>
  float per_call(int reps, F&& body) {
    FA_CU(cuEventRecord, start_, stream_);
    for (int i = 0; i < reps; ++i) body();
    FA_CU(cuEventRecord, stop_, stream_);
    FA_CU(cuEventSynchronize, stop_);
    float ms = 0;
    FA_CU(cuEventElapsedTime, &ms, start_, stop_);
    return ms / reps;
  }

 private:
  CUstream stream_;
  CUevent start_ = nullptr, stop_ = nullptr;
};

// Joins every started thread when it goes out of scope (also when starting another threw).
struct JoinAll {
  std::vector<std::thread> threads;
  ~JoinAll() {
    for (std::thread& t : threads)
      if (t.joinable()) t.join();
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string shape_class(const TuneShape& s) {
  return fmt::format("bh{} q{} kv{} blk{}x{}", pow2_at_least(s.batch_heads), pow2_at_least(s.len_q),
                     pow2_at_least(s.len_kv), s.q_block, s.kv_block);
}

std::string tune_record_key(const std::string& variant_key, const std::string& device, const std::string& cls,
                            const std::vector<KernelSpec>& candidates) {
  // The candidates are part of the key: a record names one of them, and another list (a
  // later fajit) tunes afresh instead of finding a choice it no longer offers.
  std::string list;
  for (const KernelSpec& c : candidates) list += c.to_string() + "\n";
  return jit::KeyBuilder()
      .add("autotune", "forward 1")
      .add("variant", variant_key)
      .add("device", device)
      .add("class", cls)
      .add("candidates", list)
      .hex();
}

std::string tune_record_text(const TuneRecord& r) {
  std::string text =
      fmt::format("choice {}\nclass {}\ndevice {}\n", r.chosen.to_string(), r.shape_class, r.device);
  for (const auto& [spec, ms] : r.timed) text += fmt::format("timed {:.4f} {}\n", ms, spec.to_string());
  return text;
}

std::optional<KernelSpec> parse_tune_choice(const std::string& text,
                                            const std::vector<KernelSpec>& candidates) {
  const std::string head = "choice ";
  if (text.compare(0, head.size(), head) != 0) return std::nullopt;
  const std::string spec = text.substr(head.size(), text.find('\n') - head.size());
  for (const KernelSpec& c : candidates)
    if (c.to_string() == spec) return c;
  return std::nullopt;
}

bool autotune_enabled(const Options& o) {
  const bool explicit_kernel = o.family != KernelFamily::kAuto || !o.tile.is_default();
  if (explicit_kernel && o.autotune.value_or(false))
    throw Error(
        "autotune: autotuning picks the kernel family and tile itself; leave family on auto and the tile "
        "empty, or turn autotune off");
  if (explicit_kernel) return false;
  if (o.autotune) return *o.autotune;
  const char* v = std::getenv("FAJIT_AUTOTUNE");
  if (!v) return true;
  for (const char* off : {"0", "off", "false", "no"})
    if (strcasecmp(v, off) == 0) return false;
  return true;
}

bool ForwardTuner::ClassKey::operator<(const ClassKey& o) const {
  return std::tie(batch_heads, len_q, len_kv, q_block, kv_block, regroupable, device) <
         std::tie(o.batch_heads, o.len_q, o.len_kv, o.q_block, o.kv_block, o.regroupable, o.device);
}

ForwardTuner::ForwardTuner(const Program& program, const Compiled& fwd, bool enabled)
    : program_(program), fwd_(fwd), enabled_(enabled) {}

std::vector<TuneRecord> ForwardTuner::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TuneRecord> out;
  for (const ClassKey& c : order_) out.push_back(choices_.at(c).second);
  return out;
}

std::vector<KernelSpec> tune_candidates(const Program& program, const KernelSpec& def) {
  const bool has_score_mod = score_mod_weighs(program, KernelKind::kForward);  // as generate() resolves
  return forward_tune_candidates(def, has_score_mod, !program.mask_is_noop());
}

std::vector<const Compiled*> ForwardTuner::compile_candidates() {
  std::lock_guard<std::mutex> tuning(tuning_);
  std::vector<const Compiled*> out = compile_all(tune_candidates(program_, fwd_.gen.spec));
  out.erase(out.begin());  // the default
  out.erase(std::remove(out.begin(), out.end(), nullptr), out.end());
  return out;
}

const Compiled* ForwardTuner::compiled(const KernelSpec& spec) {
  return compile_all({spec}).front();  // the default itself, or null when it did not compile
}

std::vector<const Compiled*> ForwardTuner::compile_all(const std::vector<KernelSpec>& specs,
                                                       int* compiled_now) {
  // Generation runs here, one at a time (callers hold tuning_, which also orders kernels_'
  // insertions); NVRTC (thread-safe, the cache too) in parallel.
  std::vector<const Compiled*> out(specs.size(), nullptr);
  std::vector<std::pair<size_t, GeneratedKernel>> todo;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i] == fwd_.gen.spec) {
      out[i] = &fwd_;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = kernels_.find(specs[i].to_string()); it != kernels_.end()) {
        out[i] = it->second.get();
        continue;
      }
    }
    try {
      todo.emplace_back(i, generate(program_, specs[i]));
    } catch (const std::exception& e) {  // a candidate codegen refuses is no candidate
      if (debug())
        std::cerr << "fajit: autotune: dropped " << specs[i].to_string() << ": " << e.what() << "\n";
    }
  }
  std::vector<std::unique_ptr<Compiled>> made(todo.size());
  std::vector<std::string> errors(todo.size());
  auto work = [&](size_t j) {
    try {
      made[j] =
          std::make_unique<Compiled>(compile_generated(std::move(todo[j].second), fwd_.options.line_info,
                                                       "autotune candidate of " + variant_name(program_)));
    } catch (const std::exception& e) {
      errors[j] = e.what();
    }
  };
  if (todo.size() == 1) {
    work(0);
  } else {
    JoinAll pool;
    for (size_t j = 0; j < todo.size(); ++j) pool.threads.emplace_back(work, j);
  }
  if (compiled_now)
    *compiled_now = static_cast<int>(std::count_if(
        made.begin(), made.end(), [](const auto& c) { return c && c->origin == CacheOrigin::kCompiled; }));
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t j = 0; j < todo.size(); ++j) {
    if (!made[j]) {
      if (debug()) std::cerr << "fajit: autotune: dropped a candidate: " << errors[j] << "\n";
      continue;
    }
    auto& slot = kernels_[made[j]->gen.spec.to_string()];
    if (!slot) slot = std::move(made[j]);
    out[todo[j].first] = slot.get();
  }
  return out;
}

TuneRecord ForwardTuner::time_candidates(const std::vector<const Compiled*>& kernels, CUstream stream,
                                         const Prepare& prepare) {
  TuneRecord r;
  r.chosen = fwd_.gen.spec;
  r.origin = TuneRecord::Origin::kSkipped;
  FA_CU(cuStreamSynchronize, stream);  // the caller's earlier work is not the budget's
  const auto t0 = std::chrono::steady_clock::now();
  EventTimer timer(stream);
  // The default first (its errors are the caller's): one launch to warm it, one timed; then
  // whether a warm-up launch of each candidate and two rounds of at least one fit the budget.
  const Launcher run_default = prepare(fwd_);
  run_default();
  const double t_default = std::max(timer.per_call(1, run_default), 1e-3f);
  const double n = static_cast<double>(kernels.size());
  const double left = kBudgetMs - seconds_since(t0) * 1e3;
  const double reps = std::min<double>(kMaxReps, (left - n * t_default) / (2 * n * t_default));
  if (reps < 1) {
    r.note = fmt::format("one launch takes {:.2f} ms, {} candidates do not fit {:.0f} ms", t_default,
                         kernels.size(), kBudgetMs);
    r.time_s = seconds_since(t0);
    return r;
  }
  // Every other candidate launched once (loads its module; one the driver will not launch is
  // dropped), with its function and arguments resolved outside the timed launches.
  std::vector<const Compiled*> alive{&fwd_};
  std::vector<Launcher> runs{run_default};
  for (const Compiled* c : kernels) {
    if (c == &fwd_) continue;
    try {
      Launcher l = prepare(*c);
      l();
      alive.push_back(c);
      runs.push_back(std::move(l));
    } catch (const Error& e) {
      if (debug())
        std::cerr << "fajit: autotune: " << c->gen.spec.to_string() << " did not launch: " << e.what()
                  << "\n";
    }
  }
  FA_CU(cuStreamSynchronize, stream);
  if (alive.size() < 2) {
    r.note = "no other candidate launched";
    r.time_s = seconds_since(t0);
    return r;
  }
  // Two rounds, every candidate in each (drift in clocks hits all alike); a candidate 1.5x
  // slower than the best after the first round sits out the second. Best of the rounds.
  std::vector<float> best(alive.size(), 1e30f);
  for (int round = 0; round < 2; ++round) {
    const float leader = *std::min_element(best.begin(), best.end());
    for (size_t i = 0; i < alive.size(); ++i) {
      if (round == 1 && best[i] > 1.5f * leader) continue;
      best[i] = std::min(best[i], timer.per_call(static_cast<int>(reps), runs[i]));
    }
  }
  size_t win = 0;  // alive[0] is the default
  for (size_t i = 1; i < alive.size(); ++i)
    if (best[i] * kMinGain < best[0] && best[i] < best[win]) win = i;
  r.chosen = alive[win]->gen.spec;
  for (size_t i = 0; i < alive.size(); ++i) r.timed.emplace_back(alive[i]->gen.spec, best[i]);
  r.origin = TuneRecord::Origin::kTuned;
  r.time_s = seconds_since(t0);
  return r;
}

const Compiled& ForwardTuner::choose(const TuneShape& shape, CUstream stream,
                                     const std::function<bool()>& may_time, const Prepare& prepare) {
  if (!enabled_) return fwd_;
  const std::string& device = rt::current_device_info().name;  // cached per device
  // One process may drive several GPU models: their choices are kept apart.
  const ClassKey mem_key{pow2_at_least(shape.batch_heads),
                         pow2_at_least(shape.len_q),
                         pow2_at_least(shape.len_kv),
                         shape.q_block,
                         shape.kv_block,
                         shape.regroupable,
                         device};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = choices_.find(mem_key); it != choices_.end()) return *it->second.first;
  }
  std::lock_guard<std::mutex> tuning(tuning_);
  {
    std::lock_guard<std::mutex> lock(mutex_);  // another thread may have tuned it meanwhile
    if (auto it = choices_.find(mem_key); it != choices_.end()) return *it->second.first;
  }
  const std::string cls = shape_class(shape);
  TuneRecord record;
  record.shape_class = cls;
  record.device = device;
  record.chosen = fwd_.gen.spec;
  record.origin = TuneRecord::Origin::kSkipped;
  const Compiled* chosen = &fwd_;
  // Remembered in memory only (and kTuned in the cache directory too).
  auto remember = [&]() -> const Compiled& {
    std::lock_guard<std::mutex> lock(mutex_);
    choices_.emplace(mem_key, std::make_pair(chosen, record));
    order_.push_back(mem_key);
    return *chosen;
  };

  std::vector<KernelSpec> specs = tune_candidates(program_, fwd_.gen.spec);
  // Candidates whose tile neither divides the mask's blocks nor may regroup them cannot run it.
  specs.erase(std::remove_if(specs.begin() + 1, specs.end(),
                             [&](const KernelSpec& s) {
                               return !shape.regroupable &&
                                      !tile_divides(s.tile, shape.q_block, shape.kv_block);
                             }),
              specs.end());
  if (specs.size() < 2) {
    record.note = "the default is the only candidate here";
    return remember();
  }
  const std::string key = tune_record_key(fwd_.key, device, cls, specs);
  jit::Cache& cache = jit::Cache::global();
  if (auto stored = cache.find(key)) {
    if (std::optional<KernelSpec> spec = parse_tune_choice(stored->cubin, specs))
      if (const Compiled* c = compiled(*spec)) {  // null: it no longer compiles; tune again
        chosen = c;
        record.chosen = *spec;
        record.origin = TuneRecord::Origin::kStored;
        return remember();
      }
  }
  if (!may_time()) return fwd_;  // nothing remembered: a later ordinary call tunes the class
  const auto t0 = std::chrono::steady_clock::now();
  int compiled_at_call = 0;
  std::vector<const Compiled*> kernels = compile_all(specs, &compiled_at_call);
  const double compile_s = seconds_since(t0);
  kernels.erase(std::remove(kernels.begin(), kernels.end(), nullptr), kernels.end());
  if (kernels.size() < 2) {
    record.note = "no other candidate compiled";
  } else {
    record = time_candidates(kernels, stream, prepare);
    record.shape_class = cls;
    record.device = device;
    chosen = compiled(record.chosen);  // one of the kernels just timed
  }
  record.compile_s = compile_s;
  record.compiled_at_call = compiled_at_call;
  if (record.origin == TuneRecord::Origin::kTuned) {
    const std::string text = tune_record_text(record);
    cache.get_or_compile(
        key, [&] { return text; }, fmt::format("autotune {} on {}", cls, device));
  }
  return remember();
}

}  // namespace fa::detail
