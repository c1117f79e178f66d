// fa::reference_attention and fa::brute_force_block_classes: double-precision CPU oracles.
#include "fajit/detail/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "fajit/error.h"

namespace fa {
namespace {

std::array<int64_t, 4> contiguous(int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  (void)d0;
  return {d1 * d2 * d3, d2 * d3, d3, 1};
}

void check_shape(const ReferenceShape& s) {
  auto nonneg = [](const char* what, int v) {
    if (v < 0) throw Error(fmt::format("reference_attention: {} must be >= 0, got {}", what, v));
  };
  nonneg("batch", s.batch);
  nonneg("len_q", s.len_q);
  nonneg("len_kv", s.len_kv);
  auto positive = [](const char* what, int v) {
    if (v <= 0) throw Error(fmt::format("reference_attention: {} must be > 0, got {}", what, v));
  };
  positive("heads_q", s.heads_q);
  positive("heads_kv", s.heads_kv);
  positive("dim_qk", s.dim_qk);
  positive("dim_v", s.dim_v);
  if (s.heads_q % s.heads_kv != 0)
    throw Error(fmt::format("reference_attention: heads_q ({}) is not a multiple of heads_kv ({})",
                            s.heads_q, s.heads_kv));
}

}  // namespace

ReferenceResult reference_attention(const ReferenceShape& s, const float* q, const float* k,
                                    const float* v, const ReferenceOptions& opt) {
  check_shape(s);
  if (opt.score_mod && opt.score_mod->kind() != ModKind::kScore)
    throw Error(fmt::format("reference_attention: score_mod @{} is a mask_mod",
                            opt.score_mod->name()));
  if (opt.mask_mod && opt.mask_mod->kind() != ModKind::kMask)
    throw Error(fmt::format("reference_attention: mask_mod @{} is a score_mod",
                            opt.mask_mod->name()));
  const Bindings empty;
  const Bindings& env = opt.bindings ? *opt.bindings : empty;
  std::optional<BoundMod> score_mod, mask_mod;
  if (opt.score_mod) score_mod.emplace(opt.score_mod->bind(env));
  if (opt.mask_mod) mask_mod.emplace(opt.mask_mod->bind(env));

  const double scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(s.dim_qk));
  const auto qs = opt.q_strides.value_or(contiguous(s.batch, s.heads_q, s.len_q, s.dim_qk));
  const auto ks = opt.k_strides.value_or(contiguous(s.batch, s.heads_kv, s.len_kv, s.dim_qk));
  const auto vs = opt.v_strides.value_or(contiguous(s.batch, s.heads_kv, s.len_kv, s.dim_v));
  const int group = s.heads_q / s.heads_kv;
  const double neg_inf = -std::numeric_limits<double>::infinity();

  ReferenceResult r;
  r.out.assign(static_cast<size_t>(s.batch) * s.heads_q * s.len_q * s.dim_v, 0.0);
  r.lse.assign(static_cast<size_t>(s.batch) * s.heads_q * s.len_q, neg_inf);
  std::vector<double> row(static_cast<size_t>(s.len_kv));
  if (s.batch > 0 && s.len_q > 0 && (!q || (s.len_kv > 0 && (!k || !v))))
    throw Error("reference_attention: null q, k or v");

  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      const int hk = h / group;
      for (int i = 0; i < s.len_q; ++i) {
        const float* qrow = q + b * qs[0] + h * qs[1] + i * qs[2];
        double m = neg_inf;
        for (int j = 0; j < s.len_kv; ++j) {
          if (mask_mod && !mask_mod->mask(b, h, i, j)) {
            row[j] = neg_inf;
            continue;
          }
          const float* krow = k + b * ks[0] + hk * ks[1] + j * ks[2];
          double dot = 0;
          for (int d = 0; d < s.dim_qk; ++d)
            dot += static_cast<double>(qrow[d * qs[3]]) * static_cast<double>(krow[d * ks[3]]);
          double sc = dot * scale;
          if (score_mod) sc = static_cast<double>(score_mod->score(static_cast<float>(sc), b, h, i, j));
          row[j] = sc;
          if (sc > m) m = sc;  // a NaN score does not set the max; it propagates below
        }
        const size_t ri = (static_cast<size_t>(b) * s.heads_q + h) * s.len_q + i;
        if (m == neg_inf) continue;  // fully masked: out 0, lse -inf
        double sum = 0;
        double* o = &r.out[ri * s.dim_v];
        for (int j = 0; j < s.len_kv; ++j) {
          if (row[j] == neg_inf) continue;
          const double p = std::exp(row[j] - m);
          sum += p;
          const float* vrow = v + b * vs[0] + hk * vs[1] + j * vs[2];
          for (int d = 0; d < s.dim_v; ++d) o[d] += p * static_cast<double>(vrow[d * vs[3]]);
        }
        for (int d = 0; d < s.dim_v; ++d) o[d] /= sum;
        r.lse[ri] = m + std::log(sum);
      }
    }
  }
  return r;
}

std::vector<uint8_t> brute_force_block_classes(const ModProgram& mask, const Bindings& bindings,
                                               int batch, int heads, int len_q, int len_kv,
                                               int q_block, int kv_block) {
  if (mask.kind() != ModKind::kMask)
    throw Error(fmt::format("brute_force_block_classes: @{} is a score_mod, not a mask_mod",
                            mask.name()));
  if (batch < 0 || heads < 0 || len_q < 0 || len_kv < 0)
    throw Error(fmt::format("brute_force_block_classes: negative size (batch {}, heads {}, "
                            "len_q {}, len_kv {})", batch, heads, len_q, len_kv));
  if (q_block <= 0 || kv_block <= 0)
    throw Error(fmt::format("brute_force_block_classes: block sizes must be > 0, got {} x {}",
                            q_block, kv_block));
  const BoundMod m = mask.bind(bindings);
  const int nq = (len_q + q_block - 1) / q_block, nkv = (len_kv + kv_block - 1) / kv_block;
  std::vector<uint8_t> kinds(static_cast<size_t>(batch) * heads * nq * nkv, 0);
  size_t idx = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int qb = 0; qb < nq; ++qb)
        for (int kb = 0; kb < nkv; ++kb, ++idx) {
          bool any = false, all = true;
          const int q_end = std::min(len_q, (qb + 1) * q_block);
          const int kv_end = std::min(len_kv, (kb + 1) * kv_block);
          for (int i = qb * q_block; i < q_end; ++i)
            for (int j = kb * kv_block; j < kv_end; ++j) {
              if (m.mask(b, h, i, j)) any = true;
              else all = false;
            }
          kinds[idx] = all ? 2 : any ? 1 : 0;
        }
  return kinds;
}

}  // namespace fa
