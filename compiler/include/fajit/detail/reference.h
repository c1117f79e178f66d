// fa::reference_attention: flex_attention's forward, computed on the CPU in double. The oracle
// every kernel test compares against.
//
//   fa::ReferenceShape shape{/*batch=*/2, /*heads_q=*/4, /*heads_kv=*/2, /*len_q=*/5,
//                            /*len_kv=*/7, /*dim_qk=*/8, /*dim_v=*/4};
//   fa::ReferenceOptions opt;
//   opt.mask_mod = &causal;               // a fa::ModProgram of an fa.mask_mod
//   opt.bindings = &env;                  // captures and scalars of both mods
//   fa::ReferenceResult r = fa::reference_attention(shape, q, k, v, opt);
//   // r.out [B, Hq, Lq, Dv], r.lse [B, Hq, Lq]
//
// Semantics: s = (q . k) * scale in double; the score_mod sees s rounded to float and its
// (float) result is widened back to double; masked pairs get -inf (the score_mod is evaluated
// only for pairs the mask keeps); out = softmax(s) . v and lse = log(sum(exp(s))) (natural
// log) in double. A row with no finite score (fully masked) gives out 0 and lse -inf, never
// NaN. GQA: query head h reads kv head h / (heads_q / heads_kv).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fajit/block_mask.h"
#include "fajit/detail/interp.h"

namespace fa {

struct ReferenceShape {
  int batch = 0, heads_q = 0, heads_kv = 0, len_q = 0, len_kv = 0, dim_qk = 0, dim_v = 0;
};

struct ReferenceOptions {
  std::optional<double> scale;            // default 1 / sqrt(dim_qk)
  const ModProgram* score_mod = nullptr;  // null: identity
  const ModProgram* mask_mod = nullptr;   // null: keep everything
  // The score_mod's derivative (fa::ModProgram::grad_of): reference_attention_backward needs
  // it whenever score_mod is set; the forward ignores it.
  const ModProgram* score_grad = nullptr;
  // reference_attention_backward: the O whose rowsum(dO * O) gives delta, [B, Hq, Lq, Dv]
  // contiguous; null = the reference's own O. A kernel test passes the kernel's O (rounded to
  // its dtype, as the kernel's preprocess reads it), so the oracle sees the kernel's delta:
  // sums of dS weighted by large values (a slopes[h] gradient sums dS * (kv - q)) amplify a
  // difference in delta that dQ, dK and dV barely show.
  const double* delta_out = nullptr;
  // reference_attention_backward: the LSE that P = exp(score - LSE) is recomputed from,
  // [B, Hq, Lq] contiguous; null = the reference's own. The fuzzer passes the kernel's f32 LSE:
  // a backward only has the LSE it is given, and at |LSE| past ~2^17 its f32 rounding alone
  // moves P by more than the gradients' tolerance.
  const double* lse = nullptr;
  // Moves every q·k by dot_shift·Σ_d|q_d·k_d| before the scale and the mods (0: exact). A
  // sensitivity probe: with ±Dqk·2^-24, the bound of an f32 accumulation of the products,
  // the spread of the results is the reference's own uncertainty about a kernel's.
  double dot_shift = 0;
  // reference_attention_backward: moves every dP - Δ by dp_shift·(Σ|dO_d·v_d| + Σ|dO_d·o_d|),
  // the probe for the kernels' f32 sums of dP = dO·vᵀ and Δ = rowsum(dO∘O): where dS is a
  // small difference times a large derivative (one key per row gives P = 1 and dP = Δ), their
  // rounding is what a kernel's gradient shows.
  double dp_shift = 0;
  // reference_attention_backward: rounds P (for dV = Pᵀ·dO) and dS (for dQ and dK) as the
  // kernels' matrix multiplies take them, to the inputs' 16-bit type; null = exact. A probe:
  // f16 holds nothing below 2^-25, so where every P or dS a gradient sums is that small (a row
  // dominated by one key of a pole) the kernel's gradient is 0 and the exact one 1e-12.
  double (*round_operand)(double) = nullptr;
  const Bindings* bindings = nullptr;  // for both mods; null = no bindings
  // Element strides of q [B, Hq, Lq, Dqk], k [B, Hkv, Lkv, Dqk], v [B, Hkv, Lkv, Dv];
  // unset = contiguous.
  std::optional<std::array<int64_t, 4>> q_strides, k_strides, v_strides;
};

struct ReferenceResult {
  std::vector<double> out;  // [B, Hq, Lq, Dv]
  std::vector<double> lse;  // [B, Hq, Lq]
  // [B, Hq, Lq]: the row's largest score after the mods (-inf: fully masked; NaN: a NaN score
  // and none +inf), what ForwardOptions::max_scores holds
  std::vector<double> max_score;
};

// q, k, v hold values already rounded to the run's dtype. Throws fa::Error for bad shapes
// ("heads_q (6) is not a multiple of heads_kv (4)"), mods of the wrong kind, bad bindings,
// and anything a mod throws while evaluated (out-of-bounds loads, division by zero).
ReferenceResult reference_attention(const ReferenceShape& shape, const float* q, const float* k,
                                    const float* v, const ReferenceOptions& options = {});

// The gradients of L = sum(out * dout) + sum(lse * dlse) for reference_attention's out and
// lse (flex_attention's backward), in double:
//   P = exp(T - lse), delta = rowsum(dout * out) - dlse, dP = dout . v^T, dT = P (dP - delta),
//   dS = dT * d(score_mod)/d(score), dq = scale dS . k, dk = scale dS^T . q, dv = P^T . dout;
// GQA sums dk, dv over the query heads of a KV head. Masked pairs and fully masked rows give
// zero gradients. dout [B, Hq, Lq, Dv] and dlse [B, Hq, Lq] (null = 0) are contiguous; q, k, v
// follow `options` as in reference_attention.
// With a score_mod, options.score_grad (its fa.score_grad) is required: it is evaluated in f32
// with dt = 1 at the float score, giving g = d score_mod / d score and, per fa.grad_add, the
// element's partial; dS = dT * g and each float buffer's gradient gets dT * partial (scatter at
// every read, in double). Pairs with P = 0 (a score_mod result of -inf) add nothing.
struct ReferenceGrads {
  ReferenceResult forward;  // out, lse
  std::vector<double> dq;   // [B, Hq, Lq, Dqk]
  std::vector<double> dk;   // [B, Hkv, Lkv, Dqk]
  std::vector<double> dv;   // [B, Hkv, Lkv, Dv]
  // d L / d buffer for every f32 buffer the score_mod captures, by capture name: contiguous
  // row-major in the buffer's shape (whatever the bound strides).
  std::map<std::string, std::vector<double>> buffer_grads;
};
ReferenceGrads reference_attention_backward(const ReferenceShape& shape, const float* q, const float* k,
                                            const float* v, const double* dout, const double* dlse,
                                            const ReferenceOptions& options = {});

// Classifies every q_block x kv_block tile of every (b, h) by evaluating `mask` on each
// in-range element: 0 empty (false everywhere), 1 partial, 2 full (true everywhere); elements
// past len_q / len_kv are ignored. Result [batch, heads, ceil(len_q / q_block),
// ceil(len_kv / kv_block)], the layout fa::BlockMask::from_kinds takes.
std::vector<uint8_t> brute_force_block_classes(const ModProgram& mask, const Bindings& bindings, int batch,
                                               int heads, int len_q, int len_kv, int q_block, int kv_block);

namespace detail {
// The kind of the block [q0, q1) x [k0, k1) of (b, h): `mask` on its elements row by row,
// stopping after the row that shows it partial. brute_force_block_classes and
// fa::evaluate_undecided_blocks classify each block with it.
BlockKind brute_force_block_kind(const BoundMod& mask, int b, int h, int q0, int q1, int k0, int k1);
}  // namespace detail

}  // namespace fa
