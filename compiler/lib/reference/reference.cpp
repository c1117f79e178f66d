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
    throw Error(fmt::format("reference_attention: heads_q ({}) is not a multiple of heads_kv ({})", s.heads_q,
                            s.heads_kv));
}

// The scale, element strides and GQA group of one call (options filled in with defaults).
struct Layout {
  double scale;
  std::array<int64_t, 4> qs, ks, vs;
  int group;
};
Layout layout_of(const ReferenceShape& s, const ReferenceOptions& opt) {
  return {opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(s.dim_qk)),
          opt.q_strides.value_or(contiguous(s.batch, s.heads_q, s.len_q, s.dim_qk)),
          opt.k_strides.value_or(contiguous(s.batch, s.heads_kv, s.len_kv, s.dim_qk)),
          opt.v_strides.value_or(contiguous(s.batch, s.heads_kv, s.len_kv, s.dim_v)), s.heads_q / s.heads_kv};
}

// q·k in double over strided rows, moved by shift·Σ|q_d·k_d| (ReferenceOptions::dot_shift).
double shifted_dot(const float* q, int64_t q_step, const float* k, int64_t k_step, int n, double shift) {
  double dot = 0, mag = 0;
  if (shift == 0) {
    for (int d = 0; d < n; ++d)
      dot += static_cast<double>(q[d * q_step]) * static_cast<double>(k[d * k_step]);
    return dot;
  }
  for (int d = 0; d < n; ++d) {
    const double x = static_cast<double>(q[d * q_step]) * static_cast<double>(k[d * k_step]);
    dot += x;
    mag += std::fabs(x);
  }
  return dot + shift * mag;
}

}  // namespace

ReferenceResult reference_attention(const ReferenceShape& s, const float* q, const float* k, const float* v,
                                    const ReferenceOptions& opt) {
  check_shape(s);
  if (opt.score_mod && opt.score_mod->kind() != ModKind::kScore)
    throw Error(fmt::format("reference_attention: score_mod @{} is a mask_mod", opt.score_mod->name()));
  if (opt.mask_mod && opt.mask_mod->kind() != ModKind::kMask)
    throw Error(fmt::format("reference_attention: mask_mod @{} is a score_mod", opt.mask_mod->name()));
  const Bindings empty;
  const Bindings& env = opt.bindings ? *opt.bindings : empty;
  std::optional<BoundMod> score_mod, mask_mod;
  if (opt.score_mod) score_mod.emplace(opt.score_mod->bind(env));
  if (opt.mask_mod) mask_mod.emplace(opt.mask_mod->bind(env));

  const Layout L = layout_of(s, opt);
  const double scale = L.scale;
  const auto &qs = L.qs, &ks = L.ks, &vs = L.vs;
  const int group = L.group;
  const double neg_inf = -std::numeric_limits<double>::infinity();

  ReferenceResult r;
  r.out.assign(static_cast<size_t>(s.batch) * s.heads_q * s.len_q * s.dim_v, 0.0);
  r.lse.assign(static_cast<size_t>(s.batch) * s.heads_q * s.len_q, neg_inf);
  r.max_score.assign(r.lse.size(), neg_inf);
  std::vector<double> row(static_cast<size_t>(s.len_kv));
  if (s.batch > 0 && s.len_q > 0 && (!q || (s.len_kv > 0 && (!k || !v))))
    throw Error("reference_attention: null q, k or v");

  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads_q; ++h) {
      const int hk = h / group;
      for (int i = 0; i < s.len_q; ++i) {
        const float* qrow = q + b * qs[0] + h * qs[1] + i * qs[2];
        double m = neg_inf;
        bool nan_score = false;
        for (int j = 0; j < s.len_kv; ++j) {
          if (mask_mod && !mask_mod->mask(b, h, i, j)) {
            row[j] = neg_inf;
            continue;
          }
          const float* krow = k + b * ks[0] + hk * ks[1] + j * ks[2];
          const double dot = shifted_dot(qrow, qs[3], krow, ks[3], s.dim_qk, opt.dot_shift);
          double sc = dot * scale;
          if (score_mod) sc = static_cast<double>(score_mod->score(static_cast<float>(sc), b, h, i, j));
          row[j] = sc;
          if (sc > m) m = sc;  // a NaN score does not set the max; it propagates below
          nan_score |= std::isnan(sc);
        }
        const size_t ri = (static_cast<size_t>(b) * s.heads_q + h) * s.len_q + i;
        r.max_score[ri] = nan_score && m != std::numeric_limits<double>::infinity()
                              ? std::numeric_limits<double>::quiet_NaN()
                              : m;
        if (m == neg_inf && nan_score) {  // only NaN scores (and masked ones): NaN, as softmax gives
          const double nan = std::numeric_limits<double>::quiet_NaN();
          std::fill_n(&r.out[ri * s.dim_v], s.dim_v, nan);
          r.lse[ri] = nan;
          continue;
        }
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

ReferenceGrads reference_attention_backward(const ReferenceShape& s, const float* q, const float* k,
                                            const float* v, const double* dout, const double* dlse,
                                            const ReferenceOptions& opt) {
  if (opt.score_mod && !opt.score_grad)
    throw Error(
        fmt::format("reference_attention_backward: score_mod @{} needs its derivative: set "
                    "ReferenceOptions::score_grad (fa::ModProgram::grad_of)",
                    opt.score_mod->name()));
  if (opt.score_grad && opt.score_grad->kind() != ModKind::kScoreGrad)
    throw Error(fmt::format("reference_attention_backward: score_grad @{} is not an fa.score_grad",
                            opt.score_grad->name()));
  if (opt.score_grad && !opt.score_mod)
    throw Error(fmt::format("reference_attention_backward: score_grad @{} without its score_mod",
                            opt.score_grad->name()));
  ReferenceGrads g;
  g.forward = reference_attention(s, q, k, v, opt);
  if (s.batch > 0 && s.len_q > 0 && !dout) throw Error("reference_attention_backward: null dout");
  const Bindings empty;
  const Bindings& env = opt.bindings ? *opt.bindings : empty;
  std::optional<BoundMod> mask_mod, score_mod, score_grad;
  if (opt.mask_mod) mask_mod.emplace(opt.mask_mod->bind(env));
  if (opt.score_mod) score_mod.emplace(opt.score_mod->bind(env));
  if (opt.score_grad) score_grad.emplace(opt.score_grad->bind(env));
  // One gradient per f32 capture, contiguous in its shape; grad_adds scatter into it.
  std::vector<std::vector<double>*> buffer_grad;      // by capture slot (null: i32)
  std::vector<std::array<int64_t, 4>> buffer_stride;  // contiguous element strides
  if (opt.score_grad)
    for (const CaptureInfo& c : opt.score_grad->captures()) {
      if (c.dtype != ScalarType::kF32) {
        buffer_grad.push_back(nullptr);
        buffer_stride.push_back({});
        continue;
      }
      const HostBuffer* hb = env.find_buffer(c.name);  // bind() checked it is there
      std::array<int64_t, 4> st{};
      int64_t n = 1;
      for (int d = c.rank - 1; d >= 0; --d) {
        st[d] = n;
        n *= hb->shape[d];
      }
      std::vector<double>& grad = g.buffer_grads[c.name];
      grad.assign(static_cast<size_t>(n), 0.0);
      buffer_grad.push_back(&grad);
      buffer_stride.push_back(st);
    }
  double pending_dt = 0;  // the dT the sink scales by
  const GradSink sink = [&](const GradAdd& a) {
    std::vector<double>* grad = buffer_grad[a.slot];
    if (!grad) return;  // the verifier allows no grad_add of an i32 buffer; be safe
    int64_t off = 0;
    for (int d = 0; d < a.rank; ++d) off += a.index[d] * buffer_stride[a.slot][d];
    (*grad)[off] += pending_dt * static_cast<double>(a.value);
  };
  const Layout L = layout_of(s, opt);
  const double scale = L.scale;
  const auto &qs = L.qs, &ks = L.ks, &vs = L.vs;
  const int group = L.group;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  g.dq.assign(static_cast<size_t>(s.batch) * s.heads_q * s.len_q * s.dim_qk, 0.0);
  g.dk.assign(static_cast<size_t>(s.batch) * s.heads_kv * s.len_kv * s.dim_qk, 0.0);
  g.dv.assign(static_cast<size_t>(s.batch) * s.heads_kv * s.len_kv * s.dim_v, 0.0);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int hk = h / group;
      for (int i = 0; i < s.len_q; ++i) {
        const size_t ri = (static_cast<size_t>(b) * s.heads_q + h) * s.len_q + i;
        const double lse = opt.lse ? opt.lse[ri] : g.forward.lse[ri];
        if (lse == neg_inf) continue;  // fully masked row: no gradient flows
        const float* qrow = q + b * qs[0] + h * qs[1] + i * qs[2];
        const double* dorow = dout + ri * s.dim_v;
        const double* orow = opt.delta_out ? opt.delta_out + ri * s.dim_v : &g.forward.out[ri * s.dim_v];
        double delta = dlse ? -dlse[ri] : 0.0, delta_mag = 0;
        for (int d = 0; d < s.dim_v; ++d)
          delta += dorow[d] * orow[d], delta_mag += std::fabs(dorow[d] * orow[d]);
        double* dqrow = &g.dq[ri * s.dim_qk];
        for (int j = 0; j < s.len_kv; ++j) {
          if (mask_mod && !mask_mod->mask(b, h, i, j)) continue;
          const float* krow = k + b * ks[0] + hk * ks[1] + j * ks[2];
          const float* vrow = v + b * vs[0] + hk * vs[1] + j * vs[2];
          const double dot = shifted_dot(qrow, qs[3], krow, ks[3], s.dim_qk, opt.dot_shift);
          double dp = 0;
          if (opt.dp_shift == 0) {
            for (int d = 0; d < s.dim_v; ++d) dp += dorow[d] * static_cast<double>(vrow[d * vs[3]]);
          } else {
            double mag = delta_mag;
            for (int d = 0; d < s.dim_v; ++d) {
              const double x = dorow[d] * static_cast<double>(vrow[d * vs[3]]);
              dp += x, mag += std::fabs(x);
            }
            dp += opt.dp_shift * mag;
          }
          double t = dot * scale;
          if (score_mod) t = static_cast<double>(score_mod->score(static_cast<float>(t), b, h, i, j));
          const double p = std::exp(t - lse);
          double ds = p * (dp - delta);  // dT
          if (score_grad) {
            if (p == 0) continue;  // exp(-inf): nothing flows (never 0 * an infinite derivative)
            pending_dt = ds;
            ds *= static_cast<double>(
                score_grad->score_grad(static_cast<float>(dot * scale), b, h, i, j, 1.0f, sink));
          }
          const double pv = opt.round_operand ? opt.round_operand(p) : p;
          if (opt.round_operand) ds = opt.round_operand(ds);
          const size_t kj = (static_cast<size_t>(b) * s.heads_kv + hk) * s.len_kv + j;
          double* dkrow = &g.dk[kj * s.dim_qk];
          double* dvrow = &g.dv[kj * s.dim_v];
          for (int d = 0; d < s.dim_qk; ++d) {
            dqrow[d] += scale * ds * static_cast<double>(krow[d * ks[3]]);
            dkrow[d] += scale * ds * static_cast<double>(qrow[d * qs[3]]);
          }
          for (int d = 0; d < s.dim_v; ++d) dvrow[d] += pv * dorow[d];
        }
      }
    }
  return g;
}

std::vector<uint8_t> brute_force_block_classes(const ModProgram& mask, const Bindings& bindings, int batch,
                                               int heads, int len_q, int len_kv, int q_block, int kv_block) {
  if (mask.kind() != ModKind::kMask)
    throw Error(fmt::format("brute_force_block_classes: @{} is a score_mod, not a mask_mod", mask.name()));
  if (batch < 0 || heads < 0 || len_q < 0 || len_kv < 0)
    throw Error(
        fmt::format("brute_force_block_classes: negative size (batch {}, heads {}, "
                    "len_q {}, len_kv {})",
                    batch, heads, len_q, len_kv));
  if (q_block <= 0 || kv_block <= 0)
    throw Error(
        fmt::format("brute_force_block_classes: block sizes must be > 0, got {} x {}", q_block, kv_block));
  const BoundMod m = mask.bind(bindings);
  const int nq = (len_q + q_block - 1) / q_block, nkv = (len_kv + kv_block - 1) / kv_block;
  std::vector<uint8_t> kinds(static_cast<size_t>(batch) * heads * nq * nkv, 0);
  size_t idx = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int qb = 0; qb < nq; ++qb)
        for (int kb = 0; kb < nkv; ++kb, ++idx) {
          const int q_end = std::min(len_q, (qb + 1) * q_block);
          const int kv_end = std::min(len_kv, (kb + 1) * kv_block);
          kinds[idx] =
              uint8_t(detail::brute_force_block_kind(m, b, h, qb * q_block, q_end, kb * kv_block, kv_end));
        }
  return kinds;
}

namespace detail {
BlockKind brute_force_block_kind(const BoundMod& mask, int b, int h, int q0, int q1, int k0, int k1) {
  bool any = false, all = true;
  for (int i = q0; i < q1 && !(any && !all); ++i)
    for (int j = k0; j < k1; ++j) {
      if (mask.mask(b, h, i, j))
        any = true;
      else
        all = false;
    }
  return all ? BlockKind::kFull : any ? BlockKind::kPartial : BlockKind::kEmpty;
}
}  // namespace detail

}  // namespace fa
