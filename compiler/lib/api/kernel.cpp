// fa::compile / fa::Kernel: trace -> codegen -> cache/NVRTC -> launch.
#include "fajit/kernel.h"

#include "autotune.h"
#include "compiled.h"
#include "forward_mask.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include "fajit/detail/codegen.h"
#include "fajit/detail/mask_analysis.h"
#include "fajit/detail/program_impl.h"
#include "fajit/jit/arch.h"
#include "fajit/jit/compile.h"
#include "fajit/params.h"
#include "fajit/runtime/block_mask_builder.h"
#include "fajit/runtime/bwd_params.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/fwd_params.h"
#include "fajit/runtime/memory.h"
#include "fajit/runtime/tma.h"

namespace fa {

namespace detail {

std::string variant_name(const Program& p) {
  return fmt::format("score_mod @{} mask_mod @{}", p.score_mod_name(), p.mask_mod_name());
}

jit::KernelRequest kernel_request(const GeneratedKernel& gen, bool line_info, std::string_view what) {
  jit::KernelRequest req;
  req.source = gen.source;
  req.name = gen.kernel_name + ".cu";
  req.spec = gen.spec.to_string();
  req.meta = fmt::format("{} {}", gen.spec.to_string(), what);
  req.options.arch = gen.spec.arch;
  req.options.line_info = line_info;
  return req;
}

Compiled compile_generated(GeneratedKernel gen, bool line_info, std::string_view what) {
  Compiled c;
  const jit::KernelRequest req = kernel_request(gen, line_info, what);
  jit::Lookup l = jit::compile_cached(req);
  c.key = l.entry->key;
  c.entry = l.entry;
  c.origin = l.origin;
  c.options = req.options;
  c.gen = std::move(gen);
  return c;
}

int lead_rows(const KernelSpec& s, const BlockMask& mask) {
  const int bm = s.tile.block_m;
  const int64_t len_q = mask.len_q();
  if (s.kind != KernelKind::kForward || s.family != KernelFamily::kWgmma || !sm90_forward_persistent(s) ||
      bm != 192 || len_q % bm != 64 || mask.q_block() % 64 != 0)
    return 0;
  if (mask.on_device() || mask.built_on_device() || !mask.regroupable()) return 0;
  // Key blocks the first and the last query block walk, over the mask's first (b, h) (up to 4:
  // this runs every call; about a microsecond at Lq 32k).
  const int nq = mask.num_q_blocks(), nkv = mask.num_kv_blocks();
  const int groups = std::min(mask.batch() * mask.heads(), 4);
  const uint8_t* kinds = mask.kinds().data();
  int64_t first = 0, last = 0;
  for (int g = 0; g < groups; ++g) {
    const uint8_t* row0 = kinds + (int64_t(g) * nq) * nkv;
    const uint8_t* row1 = kinds + (int64_t(g) * nq + nq - 1) * nkv;
    for (int j = 0; j < nkv; ++j) {
      first += row0[j] != uint8_t(BlockKind::kEmpty);
      last += row1[j] != uint8_t(BlockKind::kEmpty);
    }
  }
  return first < last ? 128 : 0;
}

const BlockMask& forward_mask(const KernelSpec& s, const BlockMask& mask, CallMasks* copies, Stream stream,
                              const DeriveOnDevice& derive) {
  const TileConfig& t = s.tile;
  if (const int lead = lead_rows(s, mask)) return mask.regrouped_led(t.block_m, t.block_n, lead);
  const bool one_tile_per_kv_block = s.family == KernelFamily::kWgmma;
  const int qb = mask.q_block() % t.block_m == 0 ? mask.q_block() : t.block_m;
  const int kb = one_tile_per_kv_block || mask.kv_block() % t.block_n != 0 ? t.block_n : mask.kv_block();
  if (qb == mask.q_block() && kb == mask.kv_block()) return mask;
  const BlockMask* from = &mask;
  if (mask.on_device()) {
    // Device tables are regrouped from a copy of them as they are at this call: derived on the
    // device (no sync; inside a CUDA-graph capture its kernels join the graph, so a replay reads
    // the tables as they are then), else copied to the host. One copy for all of a call's launches.
    if (!copies) throw Error("internal: device tables to regroup without a place for their copy");
    if (!copies->base) copies->base = derive ? derive(mask, stream) : mask.host_copy();
    from = &*copies->base;
  }
  const BlockMask* m = nullptr;
  if (from->built_on_device()) {
    // Regrouped on the device: kept per stream; inside a CUDA-graph capture for this call only
    // (its memory and kernels part of the graph).
    if (rt::stream_is_capturing(reinterpret_cast<CUstream>(stream))) {
      if (!copies) throw Error("internal: a regrouping for a graph capture without a place for it");
      m = &copies->kept.emplace_back(from->regrouped_now(qb, kb, stream));
    } else {
      m = &from->regrouped(qb, kb, stream);
    }
  } else {
    m = &from->regrouped(qb, kb);
  }
  // The kernel's producer and consumers would walk other tiles than the tables list.
  if (one_tile_per_kv_block && m->kv_block() != t.block_n)
    throw Error(fmt::format("internal: the wgmma forward (BLOCK_N {}) was given {}-key mask blocks",
                            t.block_n, m->kv_block()));
  return *m;
}

}  // namespace detail

namespace {

using detail::compile_generated;
using detail::Compiled;

std::string resolve_arch(const std::string& requested) {
  if (!requested.empty()) return jit::validate_arch(requested);
  if (rt::cuda_available()) {
    rt::ContextGuard guard;
    const rt::DeviceInfo& d = rt::current_device_info();
    return jit::arch_for_device(d.cc_major, d.cc_minor);
  }
  return "sm_90a";
}

// The FaCaptures block for `captures`, checked against the slots of what the mods capture.
std::vector<unsigned char> pack_captures(const std::vector<CaptureSlot>& slots, const Captures& captures) {
  FaCaptures cap;
  std::memset(&cap, 0, sizeof cap);
  auto known = [&]() {
    std::string names;
    for (const CaptureSlot& s : slots) names += (names.empty() ? "" : ", ") + s.name;
    return names.empty() ? std::string("the mods capture nothing") : "the mods capture: " + names;
  };
  for (const auto& [name, _] : captures.buffers())
    if (std::none_of(slots.begin(), slots.end(),
                     [&](const CaptureSlot& s) { return s.is_buffer && s.name == name; }))
      throw Error(fmt::format("unknown buffer capture '{}'; {}", name, known()));
  for (const auto& [name, _] : captures.scalars())
    if (std::none_of(slots.begin(), slots.end(),
                     [&](const CaptureSlot& s) { return !s.is_buffer && s.name == name; }))
      throw Error(fmt::format("unknown scalar '{}'; {}", name, known()));
  for (const CaptureSlot& s : slots) {
    const char* type = s.is_float ? "f32" : "i32";
    if (s.is_buffer) {
      auto it = captures.buffers().find(s.name);
      if (it == captures.buffers().end())
        throw Error(fmt::format("missing capture '{}' (a {} buffer of rank {})", s.name, type, s.rank));
      const TensorView& t = it->second;
      DType want = s.is_float ? DType::f32 : DType::i32;
      if (t.dtype != want)
        throw Error(
            fmt::format("capture '{}' must be a {} buffer, got {}", s.name, type, dtype_name(t.dtype)));
      if (t.rank != s.rank)
        throw Error(fmt::format("capture '{}' must have rank {}, got {}", s.name, s.rank, t.rank));
      if (t.data == nullptr) throw Error(fmt::format("capture '{}' has a null data pointer", s.name));
      cap.buffers[s.slot].ptr = t.data;
      for (int d = 0; d < t.rank; ++d) cap.buffers[s.slot].stride[d] = t.stride[d];
    } else {
      auto it = captures.scalars().find(s.name);
      if (it == captures.scalars().end()) throw Error(fmt::format("missing scalar '{}' ({})", s.name, type));
      const Captures::Scalar& v = it->second;
      if (s.is_float)
        cap.scalars[s.slot].f = v.is_float ? v.f : static_cast<float>(v.i);  // ints widen exactly enough
      else if (v.is_float)
        throw Error(fmt::format("scalar '{}' must be i32, got f32", s.name));
      else
        cap.scalars[s.slot].i = v.i;
    }
  }
  std::vector<unsigned char> bytes(sizeof cap);
  std::memcpy(bytes.data(), &cap, sizeof cap);
  return bytes;
}

// Whether a call's captured buffers (and buffer gradients) need the wide-captures twin of
// its kernels (KernelSpec::wide_captures). pack_captures has checked them.
bool wide_captures_needed(const std::vector<CaptureSlot>& slots, const Captures& captures,
                          const std::map<std::string, TensorView>* grads = nullptr) {
  auto wide = [](const TensorView& t) { return needs_wide_captures(t.rank, t.shape, t.stride); };
  for (const CaptureSlot& s : slots)
    if (s.is_buffer && wide(captures.buffers().at(s.name))) return true;
  if (grads)
    for (const auto& [_, t] : *grads)
      if (wide(t)) return true;
  return false;
}

// The forward kernel's spec as the user asked for it (resolved by codegen).
KernelSpec forward_spec(const Options& options) {
  KernelSpec spec;
  spec.kind = KernelKind::kForward;
  spec.dtype = options.dtype;
  spec.head_dim_qk = options.head_dim_qk;
  spec.head_dim_v = options.head_dim_v;
  spec.tile = options.tile;
  spec.family = options.family;
  spec.arch = resolve_arch(options.arch);
  return spec;
}

// The spec of another kernel of the same variant beside a resolved forward spec: its element
// type, head dims and arch; its own tile and family (the block-mask builder has none, the
// backward picks its own).
KernelSpec spec_beside(const KernelSpec& forward, KernelKind kind) {
  KernelSpec s = forward;
  s.kind = kind;
  // The backward takes the forward's family when that was mma.sync (asked for, or an explicit
  // forward tile); otherwise it picks its own.
  s.family = kind == KernelKind::kBackward && forward.family == KernelFamily::kMmaSync
                 ? KernelFamily::kMmaSync
                 : KernelFamily::kAuto;
  s.tile = TileConfig{};
  return s;
}

// The backward kernels' spec beside a resolved forward spec, for a layout (dense or ragged);
// `deterministic` false still takes the separate dQ kernel where that is the faster
// (bwd_prefers_separate_dq).
KernelSpec backward_spec_beside(const Program& p, const KernelSpec& forward, bool deterministic,
                                SequenceLayout layout) {
  KernelSpec spec = spec_beside(forward, KernelKind::kBackward);
  spec.layout = layout;
  spec.deterministic =
      deterministic || bwd_prefers_separate_dq(spec.resolved(score_mod_weighs(p, KernelKind::kBackward)));
  return spec;
}

// Compiles started ahead of their first use (Options::backward_in_background, and autotuning's
// candidates: start_candidate_compiles). The request's cache flight is claimed on the calling
// thread (jit::claim_compile): a first use arriving at any time waits for this compile instead
// of starting its own (and gets its error, if any), while the compile runs on a thread of its
// own. At most half the hardware threads run such compiles at once (so the caller's own compile
// always has a core); past that nothing is started and the first use compiles as it did. At exit
// the running ones are joined, before NVRTC's library object goes (the join is registered after
// it). A forked child starts none and never joins its parent's threads, and takes no lock to
// find that out; a key its parent had in flight at the fork is no flight there (jit::Cache:
// flights belong to their process), so the child compiles it itself if it needs it. (A fork
// while another thread holds one of the cache's locks, a moment, is not covered.)
class BackgroundCompiles {
 public:
  static BackgroundCompiles& get() {
    static BackgroundCompiles* jobs = [] {
      jit::Nvrtc::get();
      auto* j = new BackgroundCompiles;  // never destroyed: close() at exit instead
      std::atexit([] { get().close(); });
      return j;
    }();
    return *jobs;
  }
  // Whether a thread took the request (false: closed, a forked child, or no slot free with
  // `keep_free` of them left over; a request in memory or in flight already counts as taken).
  bool start(const jit::KernelRequest& req, unsigned keep_free = 0) {
    if (getpid() != pid_) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return false;
    join_finished();
    if (jobs_.size() + keep_free >= slots()) return false;
    Job& j = jobs_.emplace_back();  // a list node: stays put while its thread runs
    std::function<void()> job;
    try {
      job = jit::claim_compile(req);
    } catch (...) {
      jobs_.pop_back();
      throw;
    }
    if (!job) {  // in memory, or in flight already
      jobs_.pop_back();
      return true;
    }
    try {
      j.thread = std::thread([job, &done = j.done] {
        job();
        done = true;
      });
    } catch (...) {  // no thread: the claimed flight must still end, so compile here
      jobs_.pop_back();
      job();
    }
    return true;
  }
  // Joins every compile still running (a test's clean slate; fa::compile never waits here).
  void wait() {
    if (getpid() != pid_) return;
    std::list<Job> running;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running.swap(jobs_);
    }
    for (Job& j : running) j.thread.join();
  }
  void close() {
    if (getpid() != pid_) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    wait();
  }
  static unsigned slots() { return std::max(1u, std::thread::hardware_concurrency() / 2); }

 private:
  BackgroundCompiles() = default;
  void join_finished() {
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (it->done) {
        it->thread.join();
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  struct Job {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::mutex mutex_;
  std::list<Job> jobs_;
  bool closed_ = false;
  const pid_t pid_ = getpid();
};

}  // namespace

unsigned detail::background_compile_slots() { return BackgroundCompiles::slots(); }
void detail::wait_for_background_compiles() { BackgroundCompiles::get().wait(); }

namespace {

// Options::backward_in_background: the dense backward of a forward spec, generated here (the
// IR is not for other threads) and compiled on a background thread. A score_mod without a
// derivative, no NVRTC or no thread to spare starts nothing: the first backward compiles (or
// reports the error) as it would have.
void start_backward_compile(const Program& p, const KernelSpec& forward, bool line_info) {
  try {
    const KernelSpec spec = backward_spec_beside(p, forward, false, SequenceLayout::kDense);
    const GeneratedKernel gen = generate(p, spec);
    BackgroundCompiles::get().start(
        detail::kernel_request(gen, line_info, "backward of " + detail::variant_name(p)));
  } catch (...) {  // an optimisation only: fa::compile goes on without it
  }
}

// Autotuning's candidates (Options::autotune), compiled on background threads while the
// default compiles, so that the first forward call of a shape class finds them compiled and
// only times them (~0.2 s) instead of compiling them first (1.5-1.9 s on the H200 host, seven
// kernels in parallel). In the tuner's order (forward_tune_candidates: the measured favourites
// first, mma.sync last), as far as BackgroundCompiles has threads to spare; the rest compile at
// the first call as before, and one slot stays free for a later variant's backward. Only for the
// current GPU (the caller checks): without one nothing tunes, and a kernel for another arch is
// never tuned here. Generated here: the IR is not for other threads. They cost CPU time even if
// no dense forward of the variant ever runs (decoding only, say): FAJIT_AUTOTUNE=0 starts none.
void start_candidate_compiles(const Program& p, const KernelSpec& def, bool line_info) {
  try {
    const std::vector<KernelSpec> specs = detail::tune_candidates(p, def);
    const std::string what = "autotune candidate of " + detail::variant_name(p);
    for (size_t i = 1; i < specs.size(); ++i) {  // [0] is the default, compiled by the caller
      GeneratedKernel gen;
      try {
        gen = generate(p, specs[i]);
      } catch (const std::exception&) {  // a candidate codegen refuses: the tuner drops it too
        continue;
      }
      // one slot kept for the next variant's backward_in_background
      if (!BackgroundCompiles::get().start(detail::kernel_request(gen, line_info, what), 1)) return;
    }
  } catch (...) {  // an optimisation only: fa::compile goes on without it
  }
}

// What a block mask needs of a variant: the mask_mod as an interval program (compiled once),
// what the mask reads, where the captures go, and the GPU builder (compiled on first use).
// fa::Kernel holds one beside its forward kernel; fa::create_block_mask holds only this.
class MaskBuilder {
 public:
  explicit MaskBuilder(Program program)
      : program_(std::move(program)),
        range_(MaskRangeProgram::compile(program_)),
        slots_(capture_slots(program_)) {}

  const Program& program() const { return program_; }
  // The builder kernel's spec (spec_beside(..., kBlockMask)); needed only once a mask is left undecided.
  void set_spec(KernelSpec spec) { spec_ = std::move(spec); }

  // The mask is marked as agreeing with mask_mod (BlockMask::matches_mask_mod): it was decided
  // from it, symbolically or element by element.
  BlockMask build(int batch, int heads, int64_t len_q, int64_t len_kv, const Captures& captures,
                  const BlockMaskOptions& options, Stream stream) {
    return decide(batch, heads, len_q, len_kv, captures, options, stream).set_matches_mask_mod();
  }

  // The mask's tiles classified from mask_mod (see build).
  BlockMask decide(int batch, int heads, int64_t len_q, int64_t len_kv, const Captures& captures,
                   const BlockMaskOptions& options, Stream stream) {
    if (batch < 1 || heads < 1 || len_q < 1 || len_kv < 1)
      throw Error(fmt::format("block mask needs positive sizes, got B={} H={} Lq={} Lkv={}", batch, heads,
                              len_q, len_kv));
    // Block sizes are checked against the forward kernel's tile when the mask is used (forward).
    int bm = range_.reads_b() ? batch : 1;
    int hm = range_.reads_h() ? heads : 1;
    if (program_.mask_is_noop())
      return BlockMask::all_full(1, 1, len_q, len_kv, options.q_block, options.kv_block);
    std::vector<unsigned char> cap = pack_captures(slots_, captures);
    // Symbolic analysis first (CPU, no GPU): when it decides every block, that is the mask.
    // BlockKind::kUndecided marks the blocks left to the GPU builder.
    MaskAnalysis a = analyze_block_mask(range_, bm, hm, len_q, len_kv, options.q_block, options.kv_block,
                                        scalar_values_of(captures));
    if (a.undecided == 0)
      return BlockMask::from_kinds(a.batch, a.heads, len_q, len_kv, std::move(a.kinds), options.q_block,
                                   options.kv_block);
    FaCaptures fc;
    std::memcpy(&fc, cap.data(), sizeof fc);
    // The classifier and the table kernels, two modules: on the process's first build of an
    // arch the latter's compile (3/4 of the two) runs on a thread of its own beside the former's
    // (here where no thread can be had); later builds, a training step's or a new mask_mod's,
    // find the table kernels compiled and start no thread.
    const Compiled* tb = compiled_tables(spec_.arch);
    std::future<const Compiled*> t;
    if (!tb) {
      try {
        t = std::async(std::launch::async, [this] { return &tables(); });
      } catch (const std::system_error&) {
        tb = &tables();
      }
    }
    const Compiled& b = builder(wide_captures_needed(slots_, captures));
    if (!tb) tb = t.get();
    rt::ContextGuard guard;
    CUfunction fn = function_of(b, "");
    rt::BlockMaskBuildOptions o;
    o.q_block = options.q_block;
    o.kv_block = options.kv_block;
    o.stream = reinterpret_cast<CUstream>(stream);
    o.known = std::move(a.kinds);  // kUndecided: evaluate element by element on the GPU
    // The tables are built on the GPU too: nothing comes back to the host, nothing waits.
    o.tables = function_of(*tb, "_tables");
    o.regroup = function_of(*tb, "_regroup");
    return rt::build_block_mask(fn, fc, a.batch, a.heads, len_q, len_kv, o);
  }

  // The builder's modules, compiled now: the classifier (not for a mask that keeps everything:
  // nothing to evaluate), then the table kernels (a no-op mask_mod too: they derive the tables of
  // masks given on the device, torch BlockMasks, for the backward and for tiles that split the
  // blocks). Where each came from: the table kernels as this builder first found them (memory
  // where another builder of the process had compiled them), so `fajit cache warm` counts them once.
  std::vector<CacheOrigin> warm() {
    std::vector<CacheOrigin> out;
    if (!program_.mask_is_noop()) out.push_back(builder().origin);
    tables();  // (its call_once below orders tables_origin_'s write before this read)
    out.push_back(tables_origin_);
    return out;
  }

  // A from_device_kv_blocks mask's tables as they are when `stream` gets there, derived on the
  // device by the table kernels (rt::derive_device_kinds; no mask_mod, so no classifier to
  // compile): what the backward's transposed tables and a tile that splits the blocks read, with
  // no copy to the host.
  BlockMask derive(const BlockMask& mask, Stream stream) {
    const Compiled& tb = tables();
    rt::ContextGuard guard;
    return rt::derive_device_kinds(mask, function_of(tb, "_kinds"), function_of(tb, "_tables"),
                                   function_of(tb, "_regroup"), reinterpret_cast<CUstream>(stream));
  }

 private:
  // The kernel named <kernel_name><suffix> of a builder module (FAJIT_DEFINE_BLOCK_MASK_CLASSIFIER:
  // "", FAJIT_DEFINE_BLOCK_TABLES: "_tables", "_regroup", "_kinds"), in the current context.
  static CUfunction function_of(const Compiled& b, const char* suffix) {
    return rt::load_function(b.key, b.entry->cubin, b.gen.kernel_name + suffix);
  }

  // The table kernels' module (codegen's generate_block_tables): the same for every mask_mod of
  // an arch, so one per process (never freed, as the cache's entries), compiled by the first
  // builder of the arch that needs it (two at once: the cache's flight makes it one compile).
  struct TablesModules {
    std::mutex mutex;
    std::map<std::string, std::unique_ptr<Compiled>> by_arch;
  };
  static TablesModules& tables_modules() {
    static TablesModules* m = new TablesModules;
    return *m;
  }
  // This arch's table kernels if compiled already, else null.
  static const Compiled* compiled_tables(const std::string& arch) {
    TablesModules& m = tables_modules();
    std::lock_guard<std::mutex> lock(m.mutex);
    const auto it = m.by_arch.find(arch);
    return it == m.by_arch.end() ? nullptr : it->second.get();
  }
  const Compiled& tables() {
    if (const Compiled* c = compiled_tables(spec_.arch)) {
      note_tables(CacheOrigin::kMemory);
      return *c;
    }
    auto c = std::make_unique<Compiled>(
        compile_generated(generate_block_tables(spec_.arch), false, "block-mask tables"));
    note_tables(c->origin);
    TablesModules& m = tables_modules();
    std::lock_guard<std::mutex> lock(m.mutex);
    return *m.by_arch.emplace(spec_.arch, std::move(c)).first->second;
  }
  // Its own once, not mutex_: builder() holds that through a whole compile.
  void note_tables(CacheOrigin o) {
    std::call_once(tables_noted_, [&] { tables_origin_ = o; });
  }

  // The builder kernel; `wide`: its wide-captures twin (KernelSpec::wide_captures).
  const Compiled& builder(bool wide = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<Compiled>& slot = builders_[wide ? 1 : 0];
    if (!slot) {
      KernelSpec spec = spec_;
      spec.wide_captures = wide;
      slot = std::make_unique<Compiled>(
          compile_generated(generate(program_, spec), false, "mask_mod @" + program_.mask_mod_name()));
    }
    return *slot;
  }

  Program program_;
  MaskRangeProgram range_;
  std::vector<CaptureSlot> slots_;
  KernelSpec spec_;
  std::mutex mutex_;
  std::unique_ptr<Compiled> builders_[2];  // narrow, wide captures
  std::once_flag tables_noted_;
  CacheOrigin tables_origin_ = CacheOrigin::kMemory;  // the table kernels as this builder first found them
};

// Whether a dense forward of tile `t` runs `mask`: its blocks hold whole tiles, or the mask
// can be regrouped into the tile's blocks (BlockMask::regroupable, regrouped).
bool tile_divides(const TileConfig& t, const BlockMask& mask) {
  return detail::tile_divides(t, mask.q_block(), mask.kv_block());
}
bool forward_takes(const TileConfig& t, const BlockMask& mask) {
  return tile_divides(t, mask) || mask.regroupable();
}

// The checks forward and backward share: the tensors' dtype and head dims are the kernel's,
// the mask fits the shapes and the tile, the scale is usable. Returns the scale to use.
// `regroups`: the kernel (a dense forward) may run the mask regrouped (forward_takes).
float check_call(const KernelSpec& s, const char* what, const AttentionShape& shape, const BlockMask& mask,
                 float scale, bool check_tile = true, bool regroups = false) {
  if (shape.dtype != s.dtype)
    throw Error(fmt::format("q: the kernel was compiled for {}, got {}", dtype_name(s.dtype),
                            dtype_name(shape.dtype)));
  if (shape.dim_qk != s.head_dim_qk)
    throw Error(
        fmt::format("q: the kernel was compiled for head_dim_qk={}, got {}", s.head_dim_qk, shape.dim_qk));
  if (shape.dim_v != s.head_dim_v)
    throw Error(
        fmt::format("v: the kernel was compiled for head_dim_v={}, got {}", s.head_dim_v, shape.dim_v));
  if (!mask.valid())
    throw Error("block mask is empty; build one with Kernel::block_mask or fa::create_block_mask");
  mask.check_compatible(shape.batch, shape.heads_q, shape.len_q, shape.len_kv);
  if (mask.q_offset() != 0)  // the persistent forward's own regrouping (detail::forward_mask)
    throw Error(
        "block mask: its first block starts before query 0 (BlockMask::regrouped_led); pass the mask it was "
        "regrouped from");
  if (check_tile && !(regroups ? forward_takes(s.tile, mask) : tile_divides(s.tile, mask)))
    throw Error(fmt::format("block mask block sizes {}x{} must be multiples of the {} tile {}x{}",
                            mask.q_block(), mask.kv_block(), what, s.tile.block_m, s.tile.block_n));
  if (scale == 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(shape.dim_qk));
  if (!(scale > 0.0f) || !std::isfinite(scale))
    throw Error(fmt::format("scale must be positive and finite, got {}", scale));
  return scale;
}

// Options::sequences' sizes and checks are for a call with tables.
void check_sequences_given(const Sequences& seq) {
  if (!seq.any() && (seq.max_seqlen_q || seq.max_seqlen_k || seq.check_tables))
    throw Error(
        "sequences: max_seqlen_q / max_seqlen_k / check_tables given without a table (cu_seqlens_q, "
        "cu_seqlens_k, seqlens_k or page_table)");
}

// What a call reads beside its attention inputs (`named`): the captured buffers and the
// sequence tables, for check_outputs_apart.
std::vector<NamedView> call_inputs(std::vector<NamedView> named, const Captures& captures,
                                   const Sequences& seq) {
  named.reserve(named.size() + captures.buffers().size() + 4);
  for (const auto& [name, view] : captures.buffers()) named.push_back({"capture '{}'", &view, &name});
  named.push_back({"cu_seqlens_q", seq.cu_seqlens_q});
  named.push_back({"cu_seqlens_k", seq.cu_seqlens_k});
  named.push_back({"seqlens_k", seq.seqlens_k});
  named.push_back({"page_table", seq.page_table});
  return named;
}

// Whether the decoding kernel can take a query of len_q rows per sequence: at most
// kDecodeMaxLenQ, within one row of block tables.
bool decoding_kernel_fits(int len_q, const BlockMask& mask) {
  return len_q <= kDecodeMaxLenQ && len_q <= mask.q_block();
}

// A device-table mask's copy for one call (BlockMask::host_copy: the tables as they are now), and
// the stream its kernels run on: synchronized before the copy's device tables are freed. A mask
// built on the device regrouped for a captured launch (BlockMask::regrouped_now) needs no wait:
// its memory is freed on the stream, after the launch.
struct CallMaskCopy {
  detail::CallMasks masks;
  CUstream stream;
  explicit CallMaskCopy(CUstream s) : stream(s) {}
  CallMaskCopy(const CallMaskCopy&) = delete;
  CallMaskCopy& operator=(const CallMaskCopy&) = delete;
  ~CallMaskCopy() {
    if (!masks.base || masks.base->built_on_device()) return;
    try {
      rt::synchronize(stream);
    } catch (...) {  // a destructor reports nothing: the launch's own error reaches the caller
    }
  }
};

// The FaGradBuffers block of BackwardOptions::buffer_grads: each name must be a captured f32
// buffer given in `captures`, its gradient an fp32 tensor of the same shape.
FaGradBuffers grad_buffers_of(const Program& program, const std::vector<CaptureSlot>& slots,
                              const Captures& captures, const std::map<std::string, TensorView>& wanted) {
  FaGradBuffers g;
  std::memset(&g, 0, sizeof g);
  if (wanted.empty()) return g;
  const std::vector<std::string> read = detail::gradient_buffers(program);  // once, not per name
  for (const auto& [name, t] : wanted) {
    auto slot = std::find_if(slots.begin(), slots.end(), [&, &name = name](const CaptureSlot& s) {
      return s.is_buffer && s.name == name;
    });
    if (slot == slots.end())
      throw Error(fmt::format("buffer_grads: '{}' is not a buffer the mods capture", name));
    if (!slot->is_float)
      throw Error(fmt::format("buffer_grads: '{}' is an i32 buffer; only f32 buffers have gradients", name));
    if (std::find(read.begin(), read.end(), name) == read.end())
      throw Error(fmt::format("buffer_grads: the score_mod @{} does not read '{}', so it has no gradient",
                              program.score_mod_name(), name));
    const TensorView& primal = captures.buffers().at(name);  // pack_captures checked it is there
    if (t.dtype != DType::f32)
      throw Error(fmt::format("buffer_grads: '{}' must be f32, got {}", name, dtype_name(t.dtype)));
    if (t.data == nullptr) throw Error(fmt::format("buffer_grads: '{}' has a null data pointer", name));
    bool same = t.rank == primal.rank;
    for (int d = 0; same && d < t.rank; ++d) same = t.shape[d] == primal.shape[d];
    if (!same)
      throw Error(fmt::format("buffer_grads: '{}' must have the capture's shape {}, got {}", name,
                              primal.to_string(), t.to_string()));
    g.buffers[slot->slot].ptr = static_cast<float*>(t.data);
    for (int d = 0; d < t.rank; ++d) g.buffers[slot->slot].stride[d] = t.stride[d];
  }
  return g;
}

}  // namespace

struct Kernel::Impl {
  explicit Impl(Program program) : mask(std::move(program)) {}
  MaskBuilder mask;
  Compiled fwd;
  std::mutex bwd_mutex;
  // The backward kernels per layout (dense, ragged) and dQ path (atomic, deterministic), on first
  // use, and what a backward not asked to be deterministic runs in each layout.
  std::unique_ptr<Compiled> bwd[2][2];
  const Compiled* bwd_default[2] = {nullptr, nullptr};
  // On first use, per sequence layout (dense, ragged, paged): the split-KV decoding kernels,
  // and the ragged / paged prefill kernels (the dense one is fwd).
  std::unique_ptr<Compiled> dec[3];
  std::unique_ptr<Compiled> prefill[3];
  std::unique_ptr<detail::ForwardTuner> tuner;  // the dense forward per shape class (made by compile)
  std::map<std::string, std::unique_ptr<Compiled>> wide_twins;     // by the narrow kernel's cache key
  std::map<std::string, std::unique_ptr<Compiled>> kv_copy_twins;  // by the TMA kernel's cache key
  std::map<std::string, std::unique_ptr<Compiled>> tile128_twins;  // forward_for_mask's, likewise
  std::map<std::string, std::unique_ptr<Compiled>> row_max_twins;  // by the kernel's cache key

  // A kernel of this variant other than fwd, compiled from `spec` (callers hold bwd_mutex and
  // keep it in their slot); `what` names it in errors: "<what> of score_mod @S mask_mod @M".
  std::unique_ptr<Compiled> compile_beside(const KernelSpec& spec, std::string_view what) const {
    const Program& p = mask.program();
    return std::make_unique<Compiled>(compile_generated(
        generate(p, spec), fwd.options.line_info, fmt::format("{} of {}", what, detail::variant_name(p))));
  }

  const Compiled& decode_kernel(SequenceLayout layout = SequenceLayout::kDense) {
    std::lock_guard<std::mutex> lock(bwd_mutex);
    std::unique_ptr<Compiled>& slot = dec[static_cast<int>(layout)];
    if (!slot) {
      KernelSpec spec = spec_beside(fwd.gen.spec, KernelKind::kDecode);
      spec.tile = TileConfig{};
      spec.layout = layout;
      slot = compile_beside(spec, "decoding");
    }
    return *slot;
  }

  // The prefill kernel for a layout: fwd when dense, else fwd's kernel compiled for it (the
  // wgmma forward then copies K/V with cp.async: KernelSpec::resolved) on fwd's tile where the
  // layout takes it, else on the layout's default (fwd's tile, its default or Options::tile, may
  // be the dense-only 192x128 s2; a tuned tile runs dense calls only). So Options::tile is the
  // dense forward's (kernel.h).
  const Compiled& prefill_kernel(SequenceLayout layout) {
    if (layout == SequenceLayout::kDense) return fwd;
    std::lock_guard<std::mutex> lock(bwd_mutex);
    std::unique_ptr<Compiled>& slot = prefill[static_cast<int>(layout)];
    if (!slot) {
      KernelSpec spec = fwd.gen.spec;
      spec.layout = layout;
      const Program& p = mask.program();
      if (spec.family == KernelFamily::kWgmma &&
          !sm90_forward_takes_tile(spec, score_mod_weighs(p, KernelKind::kForward), !p.mask_is_noop()))
        spec.tile = TileConfig{};
      slot = compile_beside(spec, layout == SequenceLayout::kPaged ? "paged forward" : "ragged forward");
    }
    return *slot;
  }

  // The forward that runs `mask` in c's stead: c, or, where c's tile (192x128, 192x112) does
  // not divide the mask's blocks and the mask cannot be regrouped (BlockMask::regroupable: given
  // tables, not built from mask_mod) but its blocks hold whole 128x128 tiles, c with the
  // 128x128 tile, compiled on first use. Otherwise c, for check_call to refuse.
  const Compiled& forward_for_mask(const Compiled& c, const BlockMask& m) {
    constexpr TileConfig kTwin{128, 128, 12, 3};
    if (!m.valid() || forward_takes(c.gen.spec.tile, m) || !tile_divides(kTwin, m)) return c;
    return twin_of(tile128_twins, c, [&](KernelSpec& s) { s.tile = kTwin; });
  }

  // c with its spec edited by `edit`, compiled on first need, one per c in `twins`.
  template <typename Edit>
  const Compiled& twin_of(std::map<std::string, std::unique_ptr<Compiled>>& twins, const Compiled& c,
                          Edit edit) {
    std::lock_guard<std::mutex> lock(bwd_mutex);
    std::unique_ptr<Compiled>& slot = twins[c.key];
    if (!slot) {
      KernelSpec spec = c.gen.spec;
      edit(spec);
      slot = compile_beside(spec, spec.to_string());
    }
    return *slot;
  }
  // `c`, or its wide-captures twin (KernelSpec::wide_captures: the same spec with 64-bit
  // capture offsets) when `wide`, compiled on the first call that needs it.
  const Compiled& captures_twin(const Compiled& c, bool wide) {
    return wide ? twin_of(wide_twins, c, [](KernelSpec& s) { s.wide_captures = true; }) : c;
  }
  // The Hopper forward `c` with K/V copied by cp.async (KernelSpec::cp_async_kv): for a call
  // whose K or V the driver's tensor maps cannot describe.
  const Compiled& kv_copy_twin(const Compiled& c) {
    return twin_of(kv_copy_twins, c, [](KernelSpec& s) { s.cp_async_kv = true; });
  }
  // `c`, or, for a call that asks for the rows' largest scores (ForwardOptions::max_scores), its
  // twin that writes them (KernelSpec::row_max).
  const Compiled& row_max_twin(const Compiled& c, bool row_max) {
    return row_max ? twin_of(row_max_twins, c, [](KernelSpec& s) { s.row_max = true; }) : c;
  }

  // The backward kernels of a layout (dense or ragged); `deterministic` false still gives the
  // deterministic ones where they are the faster (bwd_prefers_separate_dq, decided once per
  // layout): callers launch by the spec's flag.
  const Compiled& backward_kernel(bool deterministic = false,
                                  SequenceLayout layout = SequenceLayout::kDense) {
    std::lock_guard<std::mutex> lock(bwd_mutex);
    const int l = layout == SequenceLayout::kDense ? 0 : 1;
    if (const Compiled* known = deterministic ? bwd[l][1].get() : bwd_default[l]) return *known;
    const KernelSpec spec = backward_spec_beside(mask.program(), fwd.gen.spec, deterministic, layout);
    const bool asked = deterministic;
    std::unique_ptr<Compiled>& slot = bwd[l][spec.deterministic ? 1 : 0];
    if (!slot) slot = compile_beside(spec, l ? "ragged backward" : "backward");
    if (!asked) bwd_default[l] = slot.get();
    return *slot;
  }
};

Kernel::Kernel(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

const KernelSpec& Kernel::spec() const { return impl_->fwd.gen.spec; }
const Program& Kernel::program() const { return impl_->mask.program(); }
const std::string& Kernel::cuda_source() const { return impl_->fwd.gen.source; }
const std::string& Kernel::cubin() const { return impl_->fwd.entry->cubin; }
const std::string& Kernel::cache_key() const { return impl_->fwd.key; }
CacheOrigin Kernel::origin() const { return impl_->fwd.origin; }
const std::vector<CaptureSlot>& Kernel::capture_slots() const { return impl_->fwd.gen.slots; }

std::string Kernel::ptx() const {
  jit::CompileOptions o = impl_->fwd.options;
  o.want_ptx = true;
  return jit::Nvrtc::get().compile(impl_->fwd.gen.source, impl_->fwd.gen.kernel_name + ".cu", o).ptx;
}

std::vector<unsigned char> Kernel::pack_captures(const Captures& captures) const {
  return fa::pack_captures(capture_slots(), captures);
}

BlockMask Kernel::block_mask(int batch, int heads, int64_t len_q, int64_t len_kv, const Captures& captures,
                             const BlockMaskOptions& options, Stream stream) const {
  return impl_->mask.build(batch, heads, len_q, len_kv, captures, options, stream);
}

void Kernel::forward(const TensorView& q_in, const TensorView& k_in, const TensorView& v_in,
                     const TensorView& o_in, const BlockMask& mask, const Captures& captures,
                     const ForwardOptions& options, Stream stream) const {
  // Ragged / paged calls run on [B, H, Lmax, D]-shaped views of the packed or paged tensors.
  const Sequences& seq = options.sequences;
  RaggedViews rv;
  if (seq.any()) rv = ragged_views(q_in, k_in, v_in, o_in, options.lse, seq, stream);
  const SequenceLayout layout = !seq.any() ? SequenceLayout::kDense
                                : rv.paged ? SequenceLayout::kPaged
                                           : SequenceLayout::kRagged;
  const bool dense = layout == SequenceLayout::kDense;
  const TensorView &q = dense ? q_in : rv.q, &k = dense ? k_in : rv.k, &v = dense ? v_in : rv.v,
                   &o = dense ? o_in : rv.o;
  const TensorView* lse = dense ? options.lse : rv.has_lse ? &rv.lse : nullptr;
  // max_scores as the kernels see it (like lse: [Hq, total_q] of packed queries).
  std::optional<TensorView> max_view;
  if (options.max_scores)
    max_view = dense ? *options.max_scores : ragged_rows_view(*options.max_scores, "max_scores", q_in, seq);
  const bool row_max = max_view.has_value();
  // The tables of a ragged / paged call (FaFwdParams' sequence fields).
  auto with_sequences = [&](FaFwdParams p) {
    if (dense) return p;
    p.cu_seqlens_q = seq.cu_seqlens_q ? static_cast<const int*>(seq.cu_seqlens_q->data) : nullptr;
    p.cu_seqlens_k = seq.cu_seqlens_k ? static_cast<const int*>(seq.cu_seqlens_k->data) : nullptr;
    p.seqlens_k = seq.seqlens_k ? static_cast<const int*>(seq.seqlens_k->data) : nullptr;
    if (seq.page_table) {
      p.page_table = static_cast<const int*>(seq.page_table->data);
      p.page_table_stride = seq.page_table->stride[0];
      p.page_size = static_cast<int>(k_in.shape[1]);
    }
    return p;
  };
  auto with_max = [&](FaFwdParams p) {
    if (!row_max) return p;
    p.max_scores = static_cast<float*>(max_view->data);
    p.max_stride_b = max_view->stride[0];
    p.max_stride_h = max_view->stride[1];
    return p;
  };

  check_sequences_given(seq);
  AttentionShape shape = validate_attention(q, k, v, o, lse);
  if (row_max) validate_row_output("max_scores", *max_view, q);
  // A ragged / paged call's mask is checked against the tile of the kernel that runs it, below.
  // The dense forward this mask runs on (fwd, unless its tile cannot take the mask's blocks).
  const Compiled& dense_fwd = dense ? impl_->forward_for_mask(impl_->fwd, mask) : impl_->fwd;
  const float scale = check_call(dense_fwd.gen.spec, "forward", shape, mask, options.scale, dense, true);
  // CUDA grids hold at most 65535 CTAs along y: the prefill's B x Hq (decoding's B x Hq / the
  // heads sharing a tile is never larger).
  if (int64_t(shape.batch) * shape.heads_q > 65535)
    throw Error(
        fmt::format("B x Hq = {} x {} = {} exceeds the 65535 the kernels' grid takes; split the batch",
                    shape.batch, shape.heads_q, int64_t(shape.batch) * shape.heads_q));
  std::vector<unsigned char> cap = pack_captures(captures);
  const bool wide = wide_captures_needed(capture_slots(), captures);
  // Outputs as given (packed or paged, not the kernels' views), apart from everything read.
  check_outputs_apart({{"o", &o_in}, {"lse", options.lse}, {"max_scores", options.max_scores}},
                      call_inputs({{"q", &q_in}, {"k", &k_in}, {"v", &v_in}}, captures, seq));

  if (options.path == ForwardPath::kDecode && !decoding_kernel_fits(shape.len_q, mask))
    throw Error(
        fmt::format("path kDecode: the decoding kernel takes len_q <= {} within one block row "
                    "(len_q <= the mask's q_block {}), got len_q={}",
                    kDecodeMaxLenQ, mask.q_block(), shape.len_q));
  if (options.decode_splits < 0)
    throw Error(fmt::format("decode_splits must be >= 0, got {}", options.decode_splits));
  if (takes_decoding_kernel(options.path, shape.len_q, shape.heads_q, shape.heads_kv, mask)) {
    // Split-KV decoding (templates/fajit/decode.cuh): the heads of a GQA group share a tile
    // when the tables do not depend on the head; the KV walk is cut so every SM streams.
    const Compiled& d =
        impl_->row_max_twin(impl_->captures_twin(impl_->decode_kernel(layout), wide), row_max);
    const KernelSpec& ds = d.gen.spec;
    if (mask.q_block() % ds.tile.block_m != 0 || mask.kv_block() % ds.tile.block_n != 0)
      throw Error(fmt::format("block mask block sizes {}x{} must be multiples of the decode tile {}x{}",
                              mask.q_block(), mask.kv_block(), ds.tile.block_m, ds.tile.block_n));
    rt::ContextGuard guard;
    const CUstream st = reinterpret_cast<CUstream>(stream);
    FaDecodeParams dp{};
    dp.fwd = with_max(with_sequences(rt::make_fwd_params(q, k, v, o, lse, scale, mask)));
    const int group = shape.heads_q / shape.heads_kv;
    dp.heads_per_cta = dp.fwd.mask.row_stride_h == 0 ? group : 1;
    const int rows = dp.heads_per_cta * shape.len_q;
    const int row_blocks = (rows + ds.tile.block_m - 1) / ds.tile.block_m;
    const int64_t units = int64_t(shape.batch) * (shape.heads_q / dp.heads_per_cta) * row_blocks;
    const int64_t tiles = int64_t(mask.num_kv_blocks()) * (mask.kv_block() / ds.tile.block_n);
    CUfunction fn = rt::load_function(d.key, d.entry->cubin, d.gen.kernel_name);
    int64_t splits = options.decode_splits;
    if (splits == 0) {  // as many parts as fill one wave of CTAs (at least one part each)
      // The spec's CTAs per SM, not the compiled kernel's occupancy: the same for every layout,
      // so a paged run splits (and rounds) exactly as the packed one.
      const int64_t sms = std::max(1, rt::current_device_info().sm_count);
      const int64_t per_sm = ds.decode_ctas_per_sm();
      splits = std::clamp<int64_t>(sms * per_sm / units, 1, 128);
    }
    splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(tiles, 1));
    dp.splits = static_cast<int>(splits);
    const size_t part_rows = size_t(shape.batch) * shape.heads_q * shape.len_q;
    const size_t per_row = size_t(shape.dim_v) + (row_max ? 3 : 2);  // O, m, l (and the part's max)
    rt::StreamBuffer scratch(size_t(splits) * part_rows * per_row * sizeof(float), st,
                             fmt::format("the decoding kernel's {} fp32 partial results", splits));
    dp.o_part = scratch.as<float>();
    dp.m_part = dp.o_part + size_t(splits) * part_rows * shape.dim_v;
    dp.l_part = dp.m_part + size_t(splits) * part_rows;
    dp.x_part = row_max ? dp.l_part + size_t(splits) * part_rows : nullptr;
    CUfunction combine = rt::load_function(d.key, d.entry->cubin, d.gen.kernel_name + "_combine");
    void* args[] = {&dp, cap.data()};
    rt::launch(fn,
               rt::Dim3(static_cast<unsigned>(row_blocks * splits),
                        static_cast<unsigned>(shape.batch * (shape.heads_q / dp.heads_per_cta))),
               rt::Dim3(static_cast<unsigned>(ds.threads())), static_cast<unsigned>(ds.smem_bytes()), st,
               args);
    void* cargs[] = {&dp};
    rt::launch_dependent(
        combine, rt::Dim3(static_cast<unsigned>((part_rows + kDecodeCombineWarps - 1) / kDecodeCombineWarps)),
        rt::Dim3(kDecodeCombineWarps * 32), 0, st, cargs);
    return;
  }

  // The kernel of this layout and mask; a ragged / paged call's mask against its tile.
  const Compiled& prefill = dense ? dense_fwd : impl_->forward_for_mask(impl_->prefill_kernel(layout), mask);
  if (!dense) check_call(prefill.gen.spec, "forward", shape, mask, options.scale, true, true);
  rt::ContextGuard guard;
  const CUstream st = reinterpret_cast<CUstream>(stream);
  CallMaskCopy mask_copy(st);  // device tables a tile regroups: one copy for this call's launches
  const detail::DeriveOnDevice derive = [this](const BlockMask& m, Stream s) {
    return impl_->mask.derive(m, s);
  };
  // Kernel f's launch on this call, its function and arguments resolved up front (the
  // autotuner times these with no host work between launches).
  struct PrefillLaunch {
    CUfunction fn;
    rt::Dim3 grid, block;
    unsigned smem;
    FaTmaPair maps;      // the Hopper kernel takes K and V as TMA tensor maps (its third parameter)
    FaTmaPair qmaps;     // and the persistent one Q (a; its fourth)
    FaFwdParams params;  // with the mask's tables for the tile's query rows
    unsigned char* cap;
    CUstream st;
    bool persistent;  // the persistent Hopper forward: its work counter, zeroed on the stream
    void operator()() {
      std::optional<rt::StreamBuffer> counter;
      if (persistent) {
        counter.emplace(sizeof(int), st, "the persistent forward's work counter");
        params.tile_counter = counter->as<int>();
        FA_CU(cuMemsetD32Async, reinterpret_cast<CUdeviceptr>(params.tile_counter), 0u, 1, st);
      }
      void* args[] = {&params, cap, &maps, &qmaps};
      rt::launch(fn, grid, block, smem, st, args);
    }
  };
  // The Hopper forward takes K/V by TMA; where the driver cannot map them, its cp.async twin.
  auto tma_maps = [&](const KernelSpec& s) { return rt::make_tma_pair(k, v, s.tile.block_n); };
  auto resolve = [&](const Compiled& tma_form) {
    const KernelSpec& ts = tma_form.gen.spec;
    const bool tma = ts.family == KernelFamily::kWgmma && !ts.cp_async_kv;
    const FaTmaPair maps = tma ? tma_maps(ts) : FaTmaPair{};  // the twin and mma.sync read none
    // The persistent form also takes Q by TMA (maps over Q alone; only .a is read).
    const bool wants_q = tma && maps.enabled && sm90_forward_persistent(ts);
    const FaTmaPair qmaps = wants_q ? rt::make_tma_pair(q, q, ts.tile.block_m) : FaTmaPair{};
    const Compiled& f =
        tma && (!maps.enabled || (wants_q && !qmaps.enabled)) ? impl_->kv_copy_twin(tma_form) : tma_form;
    const KernelSpec& s = f.gen.spec;
    const TileConfig& t = s.tile;
    // The persistent forward: one CTA per SM (at most one per query block), y = 1;
    // FAJIT_PERSISTENT_CTAS=N caps the CTAs (tests: many blocks per CTA on small shapes).
    const bool persistent = sm90_forward_persistent(s);
    // (the persistent form's first block may start before query 0: detail::lead_rows)
    const BlockMask& fmask = detail::forward_mask(s, mask, &mask_copy.masks, stream, derive);
    const int64_t q_blocks = (shape.len_q + fmask.q_offset() + t.block_m - 1) / t.block_m,
                  bh = int64_t(shape.batch) * shape.heads_q;
    int64_t sms = persistent ? std::max(1, rt::current_device_info().sm_count) : 0;
    if (const char* cap_env = persistent ? std::getenv("FAJIT_PERSISTENT_CTAS") : nullptr;
        cap_env && *cap_env)
      sms = std::clamp<int64_t>(std::atoll(cap_env), 1, sms);
    PrefillLaunch l{rt::load_function(f.key, f.entry->cubin, f.gen.kernel_name),
                    persistent ? rt::Dim3(static_cast<unsigned>(std::min(q_blocks * bh, sms)), 1u)
                               : rt::Dim3(static_cast<unsigned>(q_blocks), static_cast<unsigned>(bh)),
                    rt::Dim3(static_cast<unsigned>(s.threads())),
                    static_cast<unsigned>(s.smem_bytes()),
                    maps,
                    qmaps,
                    with_max(with_sequences(rt::make_fwd_params(q, k, v, o, lse, scale, fmask))),
                    cap.data(),
                    st,
                    persistent};
    return l;
  };
  // The tuner's candidates are narrow (a wide call runs the default tile) and tile the mask's
  // query blocks or regroup them (a mask that cannot be regrouped runs forward_for_mask's fallback).
  if (!dense || wide || &dense_fwd != &impl_->fwd) {
    resolve(impl_->row_max_twin(impl_->captures_twin(prefill, wide), row_max))();
    return;
  }
  // Autotuning (Options::autotune) times candidates on these tensors (outputs never overlap
  // inputs: checked above), never into a CUDA graph being captured, and on the TMA kernels
  // only (K/V the driver cannot map run the default's cp.async twin, untuned). Asked only when
  // a shape class is about to be timed, not on every call.
  const detail::TuneShape ts{int64_t(shape.batch) * shape.heads_q,
                             shape.len_q,
                             shape.len_kv,
                             mask.q_block(),
                             mask.kv_block(),
                             mask.regroupable()};
  auto may_time = [&] {
    const KernelSpec& fs = impl_->fwd.gen.spec;
    return !rt::stream_is_capturing(st) && (fs.family != KernelFamily::kWgmma || tma_maps(fs).enabled);
  };
  auto prepare = [&](const Compiled& f) -> detail::ForwardTuner::Launcher { return resolve(f); };
  // A call that asks for max_scores runs the chosen kernel's row-max twin (the candidates are
  // timed without).
  resolve(
      impl_->row_max_twin(impl_->tuner->choose(ts, st, std::ref(may_time), std::ref(prepare)), row_max))();
}

WarmReport Kernel::warm(const WarmOptions& options) const {
  WarmReport r;
  auto tally = [&r](CacheOrigin o) {
    ++r.kernels;
    (o == CacheOrigin::kCompiled ? r.compiled : o == CacheOrigin::kDisk ? r.from_disk : r.from_memory)++;
  };
  auto count = [&tally](const Compiled* c) {
    if (c) tally(c->origin);
  };
  // A forward-side kernel, and with row_max its row-max twin.
  auto forward_side = [&](const Compiled& c) {
    count(&c);
    if (options.row_max) count(&impl_->row_max_twin(c, true));
  };
  forward_side(impl_->fwd);
  if (options.block_mask)
    for (CacheOrigin o : impl_->mask.warm()) tally(o);
  if (options.backward) count(&impl_->backward_kernel(false));
  if (options.deterministic) count(&impl_->backward_kernel(true));
  if (options.decode) forward_side(impl_->decode_kernel(SequenceLayout::kDense));
  for (SequenceLayout l : {SequenceLayout::kRagged, SequenceLayout::kPaged}) {
    if (!(l == SequenceLayout::kRagged ? options.ragged : options.paged)) continue;
    forward_side(impl_->prefill_kernel(l));
    forward_side(impl_->decode_kernel(l));
  }
  if (options.ragged && options.backward) count(&impl_->backward_kernel(false, SequenceLayout::kRagged));
  if (options.ragged && options.deterministic) count(&impl_->backward_kernel(true, SequenceLayout::kRagged));
  if (options.candidates)
    for (const detail::Compiled* c : impl_->tuner->compile_candidates()) count(c);
  return r;
}

std::vector<TuneRecord> Kernel::tune_records() const { return impl_->tuner->records(); }
bool Kernel::autotunes() const { return impl_->tuner->enabled(); }

const std::string& Kernel::decode_cuda_source() const { return impl_->decode_kernel().gen.source; }
const KernelSpec& Kernel::decode_spec() const { return impl_->decode_kernel().gen.spec; }
const KernelSpec& Kernel::prefill_spec(SequenceLayout layout) const {
  return impl_->prefill_kernel(layout).gen.spec;
}

const std::string& Kernel::backward_cuda_source() const { return impl_->backward_kernel().gen.source; }
const KernelSpec& Kernel::backward_spec() const { return impl_->backward_kernel().gen.spec; }

void Kernel::backward(const TensorView& q_in, const TensorView& k_in, const TensorView& v_in,
                      const TensorView& o_in, const TensorView& lse_in, const TensorView& dout_in,
                      const TensorView& dq_in, const TensorView& dk_in, const TensorView& dv_in,
                      const BlockMask& mask_in, const Captures& captures, const BackwardOptions& options,
                      Stream stream) const {
  // Device tables (BlockMask::from_device_kv_blocks): the transposed tables the dK/dV walk reads
  // are derived from them on the device as they are when the stream gets there (the kernels'
  // own builder module: rt::derive_device_kinds; no sync), and so are the kv tables, so both agree.
  CallMaskCopy mask_copy(reinterpret_cast<CUstream>(stream));
  if (mask_in.valid() && mask_in.on_device()) mask_copy.masks.base = impl_->mask.derive(mask_in, stream);
  const BlockMask& mask = mask_copy.masks.base ? *mask_copy.masks.base : mask_in;
  // A ragged call runs on [B, H, Lmax, D]-shaped views of the packed tensors, as the forward.
  const Sequences& seq = options.sequences;
  check_sequences_given(seq);
  const bool dense = !seq.any();
  RaggedViews rv;
  RaggedGradViews gv;
  if (!dense) {
    rv = ragged_views(q_in, k_in, v_in, o_in, &lse_in, seq, stream);
    gv = ragged_grad_views(q_in, k_in, dout_in, dq_in, dk_in, dv_in, options.dlse, seq);
  }
  const TensorView &q = dense ? q_in : rv.q, &k = dense ? k_in : rv.k, &v = dense ? v_in : rv.v,
                   &o = dense ? o_in : rv.o, &lse = dense ? lse_in : rv.lse;
  const TensorView &dout = dense ? dout_in : gv.dout, &dq = dense ? dq_in : gv.dq,
                   &dk = dense ? dk_in : gv.dk, &dv = dense ? dv_in : gv.dv;
  const TensorView* dlse = dense ? options.dlse : gv.has_dlse ? &gv.dlse : nullptr;
  const AttentionShape shape = validate_attention_backward(q, k, v, o, lse, dout, dq, dk, dv, dlse);
  if (int64_t(shape.batch) * shape.heads_q > 65535)
    throw Error(
        fmt::format("B x Hq = {} x {} = {} exceeds the 65535 the kernels' grid takes; split the batch",
                    shape.batch, shape.heads_q, int64_t(shape.batch) * shape.heads_q));
  std::vector<unsigned char> cap = pack_captures(captures);
  FaGradBuffers grads = grad_buffers_of(program(), capture_slots(), captures, options.buffer_grads);
  const Compiled& b = impl_->captures_twin(
      impl_->backward_kernel(options.deterministic, dense ? SequenceLayout::kDense : SequenceLayout::kRagged),
      wide_captures_needed(capture_slots(), captures, &options.buffer_grads));
  const KernelSpec& s = b.gen.spec;
  const bool det = s.deterministic;  // asked for, or the faster at these head dims
  // deterministic with dQ summed in order by the dK/dV kernel (else by its own dq_det kernel)
  const bool ordered = bwd_orders_dq(s);
  const bool separate_dq = det && !ordered;
  const float scale = check_call(s, "backward", shape, mask, options.scale);
  {
    std::vector<NamedView> outputs = {{"dq", &dq_in}, {"dk", &dk_in}, {"dv", &dv_in}};
    for (const auto& [name, view] : options.buffer_grads)
      outputs.push_back({"buffer_grads['{}']", &view, &name});
    check_outputs_apart(outputs, call_inputs({{"q", &q_in},
                                              {"k", &k_in},
                                              {"v", &v_in},
                                              {"o", &o_in},
                                              {"lse", &lse_in},
                                              {"dout", &dout_in},
                                              {"dlse", options.dlse}},
                                             captures, seq));
  }

  rt::ContextGuard guard;
  const CUstream st = reinterpret_cast<CUstream>(stream);
  CUfunction pre = rt::load_function(b.key, b.entry->cubin, b.gen.kernel_name + "_pre");
  CUfunction dkdv = rt::load_function(b.key, b.entry->cubin, b.gen.kernel_name + "_dkdv");
  CUfunction dq_fn =
      rt::load_function(b.key, b.entry->cubin, b.gen.kernel_name + (separate_dq ? "_dq_det" : "_dq"));
  // delta / dq_accum rows: [B, Hq, Lq], or [Hq, total_q] for packed queries
  const bool packed_q = seq.cu_seqlens_q != nullptr;
  const size_t rows = packed_q ? size_t(shape.heads_q) * size_t(q_in.shape[0])
                               : size_t(shape.batch) * shape.heads_q * shape.len_q;
  const size_t delta_floats = (rows + 3) / 4 * 4;  // dq_accum rows stay 16-byte aligned
  const size_t accum_floats = separate_dq ? 0 : rows * size_t(shape.dim_qk);
  // deterministic, ordered: a counter per 64 query rows of each (sequence, query head), over
  // whole query tiles (at BLOCK_M 128 the second writer's rows of a last tile may all lie past
  // len_q: it still takes its places, on a counter of its own)
  const int order_units =
      static_cast<int>((shape.len_q + s.tile.block_m - 1) / s.tile.block_m * s.tile.block_m / 64);
  const size_t order_ints = ordered ? size_t(shape.batch) * shape.heads_q * order_units : 0;
  rt::StreamBuffer scratch((delta_floats + accum_floats) * sizeof(float) + order_ints * sizeof(int), st,
                           "the backward's fp32 scratch (delta, dQ accumulator, ordering counters)");
  float* delta = scratch.as<float>();
  float* dq_accum = separate_dq ? nullptr : delta + delta_floats;
  const rt::BwdTensors t{&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv, dlse};
  FaBwdParams p = rt::make_bwd_params(t, scale, mask, delta, dq_accum);
  if (packed_q) p.delta_stride_b = 0, p.delta_stride_h = q_in.shape[0];
  if (ordered) {
    p.dq_order = reinterpret_cast<int*>(delta + delta_floats + accum_floats);
    p.dq_order_units = order_units;
    FA_CU(cuMemsetD32Async, reinterpret_cast<CUdeviceptr>(p.dq_order), 0u, order_ints, st);
  }
  if (!dense) {
    p.cu_seqlens_q = packed_q ? static_cast<const int*>(seq.cu_seqlens_q->data) : nullptr;
    p.cu_seqlens_k = seq.cu_seqlens_k ? static_cast<const int*>(seq.cu_seqlens_k->data) : nullptr;
  }

  const unsigned bh_q = static_cast<unsigned>(shape.batch * shape.heads_q);
  const int pre_rows = bwd_aux_rows(shape.dim_v), dq_rows = bwd_aux_rows(shape.dim_qk);
  void* pre_args[] = {&p};
  rt::launch(pre, rt::Dim3(static_cast<unsigned>((shape.len_q + pre_rows - 1) / pre_rows), bh_q),
             rt::Dim3(kBwdAuxThreads), 0, st, pre_args);
  // The Hopper dK/dV kernel's dQ writers reduce into dq_accum through a tensor map and its
  // producer loads Q and dO through two (__grid_constant__ parameters four and five; the
  // mma.sync kernel takes three). Packed queries: maps of the packed tensors as [1, Hq, total_q,
  // D] (dq_accum is [Hq, total_q, D]); the kernel sends a sequence's whole tiles through them and
  // its last partial tile by cp.async / row by row, as a box would cross into the next sequence.
  FaTmaMap dq_map{};
  FaTmaPair qdo{};
  if (s.family == KernelFamily::kWgmma) {
    auto rows_of = [](const TensorView& t) {  // packed [total, H, D] as [1, H, total, D]
      return TensorView(t.data, t.dtype, {1, t.shape[1], t.shape[0], t.shape[2]},
                        {0, t.stride[1], t.stride[0], t.stride[2]});
    };
    if (dq_accum)
      dq_map = packed_q
                   ? rt::make_tma_accum(dq_accum, 1, shape.heads_q, q_in.shape[0], shape.dim_qk, 64)
                   : rt::make_tma_accum(dq_accum, shape.batch, shape.heads_q, shape.len_q, shape.dim_qk, 64);
    qdo = packed_q ? rt::make_tma_pair(rows_of(q_in), rows_of(dout_in), s.tile.block_m)
                   : rt::make_tma_pair(q, dout, s.tile.block_m);
  }
  // The three kernels run as a chain of programmatic dependent launches (backward.cuh): dK/dV
  // loads K and V while the preprocess ends, and waits for it only where it reads Δ or dq_accum.
  void* main_args[] = {&p, cap.data(), &grads, &dq_map, &qdo};
  rt::launch_dependent(
      dkdv,
      rt::Dim3(static_cast<unsigned>((shape.len_kv + s.tile.block_n - 1) / s.tile.block_n),
               static_cast<unsigned>(shape.batch * shape.heads_kv), static_cast<unsigned>(bwd_dkdv_parts(s))),
      rt::Dim3(static_cast<unsigned>(s.threads())), static_cast<unsigned>(s.smem_bytes()), st, main_args);
  if (separate_dq) {
    void* det_args[] = {&p, cap.data()};
    rt::launch_dependent(
        dq_fn, rt::Dim3(static_cast<unsigned>((shape.len_q + s.tile.block_m - 1) / s.tile.block_m), bh_q),
        rt::Dim3(static_cast<unsigned>(bwd_det_threads(s))), static_cast<unsigned>(bwd_det_smem_bytes(s)), st,
        det_args);
  } else {
    void* dq_args[] = {&p};
    rt::launch_dependent(dq_fn, rt::Dim3(static_cast<unsigned>((shape.len_q + dq_rows - 1) / dq_rows), bh_q),
                         rt::Dim3(kBwdAuxThreads), 0, st, dq_args);
  }
}

bool takes_decoding_kernel(ForwardPath path, int len_q, int heads_q, int heads_kv, const BlockMask& mask) {
  if (path != ForwardPath::kAuto) return path == ForwardPath::kDecode;
  // packed rows per KV head the decoding kernel would take (decode.cuh: a GQA group shares a
  // tile when the tables do not depend on the head)
  const int packed_rows = len_q * (mask.heads() == 1 ? heads_q / heads_kv : 1);
  return decoding_kernel_fits(len_q, mask) && packed_rows <= kDecodeAutoRows;
}

Kernel compile(const Program& program, const Options& options) {
  KernelSpec spec = forward_spec(options);
  auto impl = std::make_shared<Kernel::Impl>(program);
  const std::string what = detail::variant_name(program);
  GeneratedKernel gen = generate(program, spec);
  const bool autotune = detail::autotune_enabled(options);
  if (options.backward_in_background) start_backward_compile(program, gen.spec, options.line_info);
  // (only for the current GPU's arch: resolve_arch asked the device; an explicit arch may be
  // another GPU's, and asking the driver here would be new for such a compile)
  if (autotune && options.arch.empty() && rt::cuda_available())
    start_candidate_compiles(program, gen.spec, options.line_info);
  impl->fwd = compile_generated(std::move(gen), options.line_info, what);
  impl->mask.set_spec(spec_beside(impl->fwd.gen.spec, KernelKind::kBlockMask));
  impl->tuner = std::make_unique<detail::ForwardTuner>(impl->mask.program(), impl->fwd, autotune);
  return Kernel(std::move(impl));
}

Kernel compile(const ScoreMod& score, const MaskMod& mask, const Options& options) {
  return compile(trace(score, mask), options);
}

struct BlockMaskFactory::Impl {
  explicit Impl(Program program) : builder(std::move(program)) {}
  MaskBuilder builder;
};

BlockMaskFactory::BlockMaskFactory(const MaskMod& mask, const Options& compile_options)
    : impl_(std::make_shared<Impl>(trace(identity_score(), mask))) {
  // Only the builder: the forward spec is resolved (checking the options as fa::compile does)
  // for the builder's element type, head dims and arch, and no forward kernel is generated.
  impl_->builder.set_spec(spec_beside(forward_spec(compile_options).resolved(), KernelKind::kBlockMask));
}

BlockMask BlockMaskFactory::build(int batch, int heads, int64_t len_q, int64_t len_kv,
                                  const Captures& captures, const BlockMaskOptions& options,
                                  Stream stream) const {
  return impl_->builder.build(batch, heads, len_q, len_kv, captures, options, stream);
}

BlockMask create_block_mask(const MaskMod& mask, int batch, int heads, int64_t len_q, int64_t len_kv,
                            const Captures& captures, const BlockMaskOptions& options,
                            const Options& compile_options, Stream stream) {
  return BlockMaskFactory(mask, compile_options)
      .build(batch, heads, len_q, len_kv, captures, options, stream);
}

}  // namespace fa
