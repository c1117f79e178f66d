// Autotuning of the dense forward (fa::Options::autotune): per shape class, time the
// candidates of fa::forward_tune_candidates on the call's own tensors and remember the fastest
// in memory and in the cache directory. Private to compiler/lib/api.
#pragma once

#include <cuda.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiled.h"
#include "fajit/kernel.h"

namespace fa::detail {

// What a forward call's shape contributes to its tuning class.
struct TuneShape {
  int64_t batch_heads = 0;  // B x Hq
  int64_t len_q = 0, len_kv = 0;
  int q_block = 0, kv_block = 0;  // the block mask's
  bool regroupable = false;       // the mask can be regrouped into other blocks (BlockMask::regroupable)
};
// Whether tile `t` holds whole blocks of a q_block x kv_block mask (else a dense forward of it
// runs the mask only regrouped: BlockMask::regroupable, regrouped).
inline bool tile_divides(const TileConfig& t, int q_block, int kv_block) {
  return q_block % t.block_m == 0 && kv_block % t.block_n == 0;
}
// "bh64 q4096 kv4096 blk128x128": B x Hq, Lq and Lkv rounded up to powers of two.
std::string shape_class(const TuneShape& shape);

// The cache key of a shape class's record: the default forward's cache key, the device name,
// the class and the candidates it was chosen from (in the order tuned: the mask's filter
// applied).
std::string tune_record_key(const std::string& variant_key, const std::string& device, const std::string& cls,
                            const std::vector<KernelSpec>& candidates);

// The text a choice is stored as ("choice forward bf16 qk128 v128 wgmma tile128x128w12s3
// sm_90a", then one "timed <ms> <spec>" line per candidate), and the candidate it names
// (nullopt when it names none of them: a record from other templates, or damaged).
std::string tune_record_text(const TuneRecord& record);
std::optional<KernelSpec> parse_tune_choice(const std::string& text,
                                            const std::vector<KernelSpec>& candidates);

// The forward kernel of one fa::Kernel for each shape class. Thread-safe: concurrent calls of
// one class wait for one tuning.
class ForwardTuner {
 public:
  // `fwd` is the kernel's default forward (outlives the tuner); `enabled` false makes choose()
  // always return it.
  ForwardTuner(const Program& program, const Compiled& fwd, bool enabled);
  bool enabled() const { return enabled_; }

  // The kernel to run for `shape`: the default, a choice already made (memory, then the
  // cache directory), or one made now by timing the candidates on `stream` (when `may_time()`,
  // asked only then; else the default, and nothing is remembered). `prepare` resolves a
  // kernel's function and arguments for this call and returns what launches it (no host work
  // left in the timing).
  using Launcher = std::function<void()>;
  using Prepare = std::function<Launcher(const Compiled&)>;
  const Compiled& choose(const TuneShape& shape, CUstream stream, const std::function<bool()>& may_time,
                         const Prepare& prepare);

  std::vector<TuneRecord> records() const;

  // The candidates other than the default, compiled now (in parallel, through the cache) as a
  // first tuning would: Kernel::warm. Those that do not compile are left out.
  std::vector<const Compiled*> compile_candidates();

 private:
  // A candidate compiled once (null when it does not compile); callers hold tuning_.
  const Compiled* compiled(const KernelSpec& spec);
  // null: did not compile; `compiled_now`: how many of them this call compiled itself
  std::vector<const Compiled*> compile_all(const std::vector<KernelSpec>& specs, int* compiled_now = nullptr);
  TuneRecord time_candidates(const std::vector<const Compiled*>& kernels, CUstream stream,
                             const Prepare& prepare);

  // A shape class on one GPU model, as the memory's key: what shape_class() prints (the
  // lengths rounded up to powers of two) and the device name (process-lifetime storage of
  // rt::device_info), so a call that finds its choice formats no text.
  struct ClassKey {
    int64_t batch_heads, len_q, len_kv;
    int q_block, kv_block;
    bool regroupable;
    std::string_view device;
    bool operator<(const ClassKey& o) const;
  };

  const Program& program_;
  const Compiled& fwd_;
  const bool enabled_;
  mutable std::mutex mutex_;  // choices_, order_, kernels_
  std::mutex tuning_;         // one tuning (and code generation) at a time
  std::map<ClassKey, std::pair<const Compiled*, TuneRecord>> choices_;
  std::vector<ClassKey> order_;
  std::map<std::string, std::unique_ptr<Compiled>> kernels_;  // by spec text
};

// Options::autotune resolved: the value, else on unless $FAJIT_AUTOTUNE is 0, off, false or no;
// off for an explicit family or tile (and fa::Error when autotune is asked for with one).
bool autotune_enabled(const Options& options);

// The candidates the tuner times for `program`'s resolved dense forward `def`, the default first
// (forward_tune_candidates with the mods as generate() resolves them): ForwardTuner and
// fa::compile's background compiles, whose kernels the tuner must find by the same keys.
std::vector<KernelSpec> tune_candidates(const Program& program, const KernelSpec& def);

}  // namespace fa::detail
