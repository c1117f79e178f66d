// fa::compile and fa::Kernel: one attention variant, compiled (or fetched from the cache) and
// ready to launch.
//
//   auto k = fa::compile(fa::mods::alibi(), fa::mods::causal(), fa::Options{});
//   fa::Captures cap;
//   cap.scalar("num_heads", 16);
//   fa::BlockMask mask = k.block_mask(B, H, L, L, cap);
//   k.forward(q, k_, v, o, mask, cap);                // TensorViews of device memory
//
// Lambdas work too: fa::compile([](fa::Score s, fa::Index b, fa::Index h, fa::Index q,
// fa::Index kv) { return s; }, [](auto b, auto h, auto q, auto kv) { return q >= kv; }).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "fajit/block_mask.h"
#include "fajit/cache_origin.h"
#include "fajit/captures.h"
#include "fajit/frontend.h"
#include "fajit/kernel_spec.h"
#include "fajit/sequences.h"
#include "fajit/tensor.h"

namespace fa {

struct Options {
  DType dtype = DType::bf16;
  int head_dim_qk = 128;
  int head_dim_v = 128;
  KernelFamily family = KernelFamily::kAuto;  // wgmma on sm_90a, mma.sync elsewhere
  TileConfig tile;         // default: per head dims; with kWgmma one of its list (kernel_spec.h).
                           // The dense forward's: the ragged / paged prefill kernels take it where
                           // their layout's list has it, else their own default
  std::string arch;        // "" = the current GPU's; sm_90a when there is no GPU
  bool line_info = false;  // NVRTC -lineinfo (for profilers)
  // Autotuning of the dense forward (family kAuto and the default tile only): for the current
  // GPU (arch empty), fa::compile starts the candidates of fa::forward_tune_candidates compiling
  // on background threads beside the default (within half the hardware threads, one kept for a
  // backward_in_background; joined at exit; CPU time spent even if no dense forward ever runs);
  // the first forward call of each shape class (B x Hq, Lq, Lkv rounded up to powers of two,
  // the mask's block sizes) on a device waits for those and compiles the rest (in parallel,
  // through the cache), times them on the call's own tensors for about 200 ms in
  // all, and runs the fastest from then on (the default unless another is >= 2 % faster). The
  // choice is kept in the cache directory beside the cubins, keyed by variant, device name and
  // shape class, so later processes skip the timing. That first call synchronizes its stream;
  // a stream being captured into a CUDA graph is not tuned (the default runs). Unset: on unless
  // $FAJIT_AUTOTUNE is 0, off, false or no (read by fa::compile); true with an explicit family
  // or tile is an fa::Error.
  std::optional<bool> autotune;
  // Compile the backward kernels (dense layout, the default dQ path) on a background thread
  // while the forward compiles, into the process's kernel cache, so that training's first
  // backward finds them ready: the two compiles overlap instead of running one after the
  // other. Kernel::backward and Kernel::warm use them as usual (waiting for the compile if it
  // is still running). A failure there (a score_mod without a derivative, say) is not reported
  // here: the first backward reports it. Compiles still running at exit are joined first.
  bool backward_in_background = false;
};

// What autotuning chose for one shape class (Kernel::tune_records).
struct TuneRecord {
  enum class Origin : uint8_t {
    kTuned,   // timed in this process
    kStored,  // read from the cache (this process's or an earlier one's)
    kSkipped  // not timed (note says why): the default, remembered in this process only
  };
  std::string shape_class;  // "bh64 q4096 kv4096 blk128x128"
  std::string device;       // the device name the choice was made on
  KernelSpec chosen;
  Origin origin = Origin::kTuned;
  std::vector<std::pair<KernelSpec, float>> timed;  // kTuned: each candidate's ms per launch
  double compile_s = 0, time_s = 0;                 // kTuned: compiling the candidates, timing them
  std::string note;                                 // kSkipped: why nothing was timed
  // kTuned: how many candidates the call compiled itself. The others were in memory, on disk, or
  // compiling since fa::compile started them beside the default (compile_s waited for those).
  int compiled_at_call = 0;
};
// One line: "bh64 q4096 kv4096 blk128x128: tuned wgmma 128x128w12s3 (wgmma 128x128w12s3 1.021 ms,
// ..., compile 1.52 s, timing 0.18 s) on NVIDIA H200".
FA_API std::string to_string(const TuneRecord& record);

// Which kernel runs a forward call: kAuto takes the split-KV decoding kernel
// (templates/fajit/decode.cuh) for short queries — len_q <= kDecodeMaxLenQ within one row of
// block tables (len_q <= the mask's q_block) and at most kDecodeAutoRows packed rows per KV
// head (len_q x the GQA group when the tables do not depend on the head, else len_q) — and the
// prefill kernel otherwise; kPrefill and kDecode force one (kDecode on a query the decoding
// kernel cannot take is an error). The row limit is the measured crossover (H200, bf16 d128,
// Hq 32 / Hkv 8, 32k keys): decode 0.45 vs prefill 0.50 ms at 128 rows (Lq 32), 0.65 vs 0.50
// at 256 (Lq 64); bench/RESULTS.md.
enum class ForwardPath : uint8_t { kAuto, kPrefill, kDecode };
constexpr int kDecodeMaxLenQ = 64;
constexpr int kDecodeAutoRows = 128;
// Whether Kernel::forward runs the decoding kernel for a query of len_q rows per sequence over
// `mask` (the rule above; kDecode always, kPrefill never).
FA_API bool takes_decoding_kernel(ForwardPath path, int len_q, int heads_q, int heads_kv,
                                  const BlockMask& mask);

struct ForwardOptions {
  float scale = 0.0f;               // 0 = 1 / sqrt(head_dim_qk)
  const TensorView* lse = nullptr;  // optional fp32 [B, Hq, Lq] log-sum-exp output
  // Optional fp32 [B, Hq, Lq] output: each row's largest score after score_mod and mask_mod,
  // in natural units (what the softmax takes; flex_attention's AuxRequest(max_scores=True)):
  // -inf for a row with nothing unmasked, NaN for a row with a NaN score (+inf if one is +inf).
  // The kernels that write it are the row-max twins (KernelSpec::row_max) of the forward and
  // decoding kernels, compiled on the first call that asks; the default kernels track no max.
  const TensorView* max_scores = nullptr;
  ForwardPath path = ForwardPath::kAuto;
  int decode_splits = 0;  // decoding: parts of the KV walk; 0 = one wave of CTAs (spec's CTAs per SM)
  // Ragged (packed, variable-length) batches and paged KV caches (fajit/sequences.h). Any table
  // given switches q/k/v/o/lse/max_scores to the layouts described there; the kernels for it (the
  // forward's family in that layout, decoding) are compiled on first use, once: lengths and
  // pages are run-time data.
  Sequences sequences;
};

struct BackwardOptions {
  float scale = 0.0f;                // the forward's scale; 0 = 1 / sqrt(head_dim_qk)
  const TensorView* dlse = nullptr;  // optional fp32 [B, Hq, Lq]: the loss's gradient of the LSE
  // Gradients of captured f32 buffers, by capture name: fp32 tensors of the capture's shape
  // (any strides). The gradient is ADDED to what they hold (pass zeros for the plain gradient),
  // as autograd accumulates .grad; buffers not named get none.
  std::map<std::string, TensorView> buffer_grads;
  // Bit-identical dQ, dK, dV run to run: dQ's fp32 sums are added in a fixed order. On the
  // Hopper kernels up to head dims 128 the dK/dV kernel adds each 64 query rows' parts in
  // ascending key-block order (a counter per 64 rows); elsewhere dQ comes from its own kernel
  // walking the forward's block tables. Buffer gradients still use atomics. (The ordered waits
  // are bounded: tables whose forward and transposed halves disagree, which fajit never builds,
  // would cost half a second or more a dQ part and lose the fixed order, not the sums.)
  bool deterministic = false;
  // A packed (cu_seqlens) batch, as the forward took it (fajit/sequences.h): the same tables and
  // maxima; dout, dq are packed like q and o ([total_q, Hq, D]), dk, dv like k and v
  // ([total_kv, Hkv, D]), lse and dlse [Hq, total_q]. Rows of dq / dk / dv that lie in no
  // sequence (before cu_seqlens[0] or past cu_seqlens[B]) are not written. Paged and padded
  // (seqlens_k) keys are inference layouts: the backward refuses them.
  Sequences sequences;
};

struct BlockMaskOptions {
  int q_block = BlockMask::kDefaultBlock;
  int kv_block = BlockMask::kDefaultBlock;
};

// Which of a kernel's lazily compiled kernels Kernel::warm compiles now.
struct WarmOptions {
  bool block_mask = true;      // the block-mask builder: its classifier (none for a mask that keeps
                               // everything) and its table kernels (one module per arch, shared)
  bool backward = false;       // the backward kernels (dQ by atomics)
  bool deterministic = false;  // the backward kernels of deterministic mode
  bool decode = false;         // the split-KV decoding kernel (dense layout)
  bool ragged = false;         // the packed (cu_seqlens) prefill and decoding kernels, and with
                               // backward / deterministic the packed backward too
  bool paged = false;          // the paged-KV prefill and decoding kernels
  bool row_max = false;        // also the row-max twins (ForwardOptions::max_scores) of the forward
                               // and of the decoding, ragged and paged kernels named above
  bool candidates = false;     // the dense forward's autotuning candidates (forward_tune_candidates):
                               // a first call that tunes then only times them (with the cache
                               // directory shipped, in a fresh process too). Compiled whatever this
                               // kernel's own autotune setting, for the cache's sake; not their
                               // row-max twins. Forward calls wait while they compile.
};

// What Kernel::warm compiled, by where each kernel came from (the forward included).
struct WarmReport {
  int kernels = 0;
  int compiled = 0, from_disk = 0, from_memory = 0;
};

class FA_API Kernel {
 public:
  struct Impl;
  explicit Kernel(std::shared_ptr<Impl> impl);

  const KernelSpec& spec() const;
  const Program& program() const;
  const std::string& cuda_source() const;
  const std::string& cubin() const;
  std::string ptx() const;  // compiled on first request (not cached on disk)
  const std::string& cache_key() const;
  CacheOrigin origin() const;
  const std::vector<CaptureSlot>& capture_slots() const;

  // The block-sparse tables of this kernel's mask_mod for [B, H, Lq, Lkv], built on the GPU
  // by a kernel generated from the same mask_mod (B or H become 1 when the mask ignores them).
  BlockMask block_mask(int batch, int heads, int64_t len_q, int64_t len_kv, const Captures& captures = {},
                       const BlockMaskOptions& options = {}, Stream stream = nullptr) const;

  // O = attention(Q, K, V) with this kernel's mods. Shapes, dtypes, strides, the mask and the
  // captures are validated before launch; errors name the offending argument. Outputs (o, lse,
  // max_scores) must not share memory with an input (q, k, v, a captured buffer, a sequence
  // table) or with each other.
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const BlockMask& mask, const Captures& captures = {}, const ForwardOptions& options = {},
               Stream stream = nullptr) const;

  // dQ, dK, dV of attention(Q, K, V) with this kernel's mods, from the forward's O and LSE
  // (Kernel::forward with ForwardOptions::lse) and dO = dL/dO (and optionally dL/dLSE):
  //   k.forward(q, k_, v, o, mask, cap, {.lse = &lse});
  //   k.backward(q, k_, v, o, lse, dout, dq, dk, dv, mask, cap);
  // Gradients have their primal's shape and dtype (any strides with 16-byte rows); GQA sums
  // dK, dV over the query heads of each KV head. Every argument is validated before launch and
  // errors name it; dq, dk, dv and the buffer gradients must not share memory with what the
  // call reads or with each other. The backward kernels are compiled on the first call. fp32
  // scratch (Lq x (Dqk + 1) per query head; deterministic on sm_90a up to head dim 128 also an
  // int per 64 query rows) is allocated and freed in stream order.
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const BlockMask& mask, const Captures& captures = {},
                const BackwardOptions& options = {}, Stream stream = nullptr) const;
  // Compiles now, through the memory and disk caches, the kernels that otherwise compile on
  // first use (a server warms them at start; `fajit cache warm` fills the disk cache ahead of
  // time). fa::Error as the first use would throw it (e.g. a score_mod without a derivative
  // and `backward`).
  WarmReport warm(const WarmOptions& options = {}) const;

  // What autotuning chose so far, one record per shape class, in the order first met (empty
  // when autotuning is off for this kernel).
  std::vector<TuneRecord> tune_records() const;
  bool autotunes() const;  // whether forward calls are autotuned (Options::autotune, resolved)

  // The decoding kernel's generated CUDA source and spec (compiled on first request).
  const std::string& decode_cuda_source() const;
  const KernelSpec& decode_spec() const;
  // The prefill (Lq > 64) kernel's spec for a sequence layout (compiled on first request): the
  // dense forward's for kDense; for kRagged / kPaged its family and tile as those layouts run it.
  const KernelSpec& prefill_spec(SequenceLayout layout) const;
  // The backward's generated CUDA source and spec (compiled on first request).
  const std::string& backward_cuda_source() const;
  const KernelSpec& backward_spec() const;

  // The FaCaptures block for `captures`, checked against what the mods capture (exposed for
  // tests and embedders).
  std::vector<unsigned char> pack_captures(const Captures& captures) const;

 private:
  std::shared_ptr<Impl> impl_;
};

FA_API Kernel compile(const Program& program, const Options& options = {});
FA_API Kernel compile(const ScoreMod& score, const MaskMod& mask, const Options& options = {});

namespace detail {
inline ScoreMod as_score_mod(const ScoreMod& s) { return s; }
template <typename F>
ScoreMod as_score_mod(F&& f) {
  return ScoreMod{"score_mod", ScoreModFn(std::forward<F>(f))};
}
inline MaskMod as_mask_mod(const MaskMod& m) { return m; }
template <typename F>
MaskMod as_mask_mod(F&& f) {
  return MaskMod{"mask_mod", MaskModFn(std::forward<F>(f))};
}

template <typename S>
constexpr bool is_score_mod_like_v = std::is_same_v<std::decay_t<S>, ScoreMod> ||
                                     std::is_invocable_r_v<Score, S, Score, Index, Index, Index, Index>;
template <typename M>
constexpr bool is_mask_mod_like_v =
    std::is_same_v<std::decay_t<M>, MaskMod> || std::is_invocable_r_v<Bool, M, Index, Index, Index, Index>;
}  // namespace detail

template <typename S, typename M,
          typename = std::enable_if_t<detail::is_score_mod_like_v<S> && detail::is_mask_mod_like_v<M> &&
                                      !(std::is_same_v<std::decay_t<S>, ScoreMod> &&
                                        std::is_same_v<std::decay_t<M>, MaskMod>)>>
Kernel compile(S&& score, M&& mask, const Options& options = {}) {
  return compile(detail::as_score_mod(std::forward<S>(score)), detail::as_mask_mod(std::forward<M>(mask)),
                 options);
}

// The block masks of one mask_mod, built as often as its captures or sizes change (a new
// document packing every training step, say): the mask_mod is traced and analysed once, and
// its GPU builder compiled once (on first use), where fa::create_block_mask does all of that at
// every call. Copies share one builder; build() may be called from several threads.
class FA_API BlockMaskFactory {
 public:
  explicit BlockMaskFactory(const MaskMod& mask, const Options& compile_options = {});
  // fa::create_block_mask's result for these sizes and captures.
  BlockMask build(int batch, int heads, int64_t len_q, int64_t len_kv, const Captures& captures = {},
                  const BlockMaskOptions& options = {}, Stream stream = nullptr) const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// fa::create_block_mask(mask, B, H, Lq, Lkv): the block mask alone (compiles only the builder).
// BlockMaskFactory(mask, compile_options).build(...): a mask_mod used again is better held as one.
FA_API BlockMask create_block_mask(const MaskMod& mask, int batch, int heads, int64_t len_q, int64_t len_kv,
                                   const Captures& captures = {}, const BlockMaskOptions& options = {},
                                   const Options& compile_options = {}, Stream stream = nullptr);

}  // namespace fa
