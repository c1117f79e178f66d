// The fuzzer's float64 comparisons (compare.h).
#include "compare.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace fa_fuzz {

Compared compare(const std::vector<double>& got, const std::vector<double>& ref) {
  Compared c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i]) || !std::isfinite(got[i])) {
      if (!same_nonfinite(got[i], ref[i]) && c.unexpected++ == 0) c.first_bad = i;
      continue;
    }
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  c.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

// The element with the largest error (or the first non-finite mismatch) of `got` vs `ref`.
size_t worst(const std::vector<double>& got, const std::vector<double>& ref) {
  size_t at = 0;
  double err = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool fin = std::isfinite(ref[i]) && std::isfinite(got[i]);
    const bool same = fin || same_nonfinite(got[i], ref[i]);
    const double e = !same ? INFINITY : fin ? std::fabs(got[i] - ref[i]) : 0;
    if (e > err) err = e, at = i;
  }
  return at;
}

namespace {

// Calls fn(j, in, scores) for every key j < r.len_kv the mask keeps: in[k] the f32 score the
// score_mod sees, its q·k moved first by move(k)·Dqk·2^-24·Σ|q_d·k_d| (move(k) = 0: exact) and
// scaled as the kernels scale it, scores[k] the score_mod's f32 result of it: one dot product
// per key for all N moves. move(k) = kAtZero: the score 0 where the moves' span holds it (an
// f32 sum may cancel to exactly 0, where h / s · s is NaN), else the exact one.
constexpr double kAtZero = 1e300;
template <size_t N, typename Move, typename Fn>
void for_each_score(const RowContext& x, const RowId& r, Move&& move, Fn&& fn) {
  const Shape& s = x.c.shape;
  const int hk = r.h / (s.heads_q / s.heads_kv);
  const double scale = 1.0 / std::sqrt(double(s.dim_qk)), eps = s.dim_qk * 0x1p-24;
  const float* qr = &x.q.values[((size_t(r.b) * s.heads_q + r.h) * s.len_q + r.i) * s.dim_qk];
  for (int j = 0; j < r.len_kv; ++j) {
    if (!x.mask.mask(r.b, r.h, r.i, j)) continue;
    const float* kr = &x.k.values[((size_t(r.b) * s.heads_kv + hk) * s.len_kv + j) * s.dim_qk];
    double dot = 0, mag = 0;
    for (int d = 0; d < s.dim_qk; ++d) dot += double(qr[d]) * kr[d], mag += std::fabs(double(qr[d]) * kr[d]);
    std::array<float, N> in{}, sc{};
    for (size_t k = 0; k < N; ++k) {
      const double m = move(k);
      in[k] = m != kAtZero                  ? static_cast<float>((dot + m * eps * mag) * scale)
              : std::fabs(dot) <= eps * mag ? 0.f
                                            : static_cast<float>(dot * scale);
      sc[k] = x.score.score(in[k], r.b, r.h, r.i, j);
    }
    fn(j, in, sc);
  }
}

// The moves unstable_row and unstable_gradients probe: down, none, up, and the score 0.
using Moved = std::array<float, 4>;
constexpr double probe_move(size_t k) { return k < 3 ? double(k) - 1 : kAtZero; }

// Whether f32 values of one quantity under the moves differ by more than 1e-3 (relative from 1
// on) or in NaN-ness or ±inf: a quantity with no answer at f32.
bool moves_apart(const Moved& v) {
  const float a = v[0];
  if (!std::all_of(v.begin(), v.end(), [](float y) { return std::isfinite(y); }))
    return !(std::isinf(a) && std::all_of(v.begin(), v.end(), [a](float y) { return y == a; }));
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo > 1e-3 * std::max(1.f, std::max(std::fabs(*lo), std::fabs(*hi)));
}

// Whether a score under the probe's moves has no answer at f32 for a softmax: apart as
// above, or apart by more than 0.5 in absolute terms. P = exp(score - LSE) moves by a factor
// of e^(hi - lo), whatever the score's size: a mod of slope 1e5 (pow(86, score) at 3e4) moves
// P by e^±3.6 under the bound's moves, and a kernel's forward (its LSE) and backward (its P)
// may sit at opposite ends — P up to e^7 where the reference has 1.
bool scores_move_apart(const Moved& v) {
  if (moves_apart(v)) return true;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo > 0.5f;
}
}  // namespace

// What the float64 reference saw in query row r: masked keys, NaN and ±inf scores (score_mod
// results in f32, as both sides evaluate them) and the range of the finite ones, so a failure
// shows whether it is about non-finite or huge scores.
std::string describe_row(const RowContext& x, const RowId& r) {
  int kept = 0, nan = 0, pinf = 0, ninf = 0, first_odd = -1, at_max = -1, at_min = -1;
  double lo = INFINITY, hi = -INFINITY;
  for_each_score<1>(
      x, r, [](size_t) { return 0.0; },
      [&](int j, const std::array<float, 1>&, const std::array<float, 1>& v) {
        const float sc = v[0];
        ++kept;
        if (std::isnan(sc) || std::isinf(sc)) {
          (std::isnan(sc) ? nan : sc > 0 ? pinf : ninf)++;
          if (first_odd < 0) first_odd = j;
          return;
        }
        if (sc > hi) hi = sc, at_max = j;
        if (sc < lo) lo = sc, at_min = j;
      });
  std::string d = fmt::format("row b {} h {} q {}: {} keys, {} masked, {} NaN, {} +inf, {} -inf scores", r.b,
                              r.h, r.i, r.len_kv, r.len_kv - kept, nan, pinf, ninf);
  if (first_odd >= 0) d += fmt::format(" (first non-finite at kv {})", first_odd);
  if (at_max >= 0)
    d += fmt::format("; finite scores in [{:.6g} (kv {}), {:.6g} (kv {})]", lo, at_min, hi, at_max);
  return d;
}

// One row of the float64 reference (the same arithmetic as fa::reference_attention), each q·k
// first moved by `dir`·ε·Σ|q_d·k_d| with ε = Dqk·2^-24 — the bound of the kernels' f32
// accumulation of Dqk exact products — dir = +1, -1, or random signs per key when `dir` is 0.
void reference_row(const RowContext& x, const RowId& r, int dir, std::mt19937_64& rng, double* out,
                   double* lse, double* max_score) {
  const Shape& s = x.c.shape;
  const int hk = r.h / (s.heads_q / s.heads_kv);
  std::vector<double> row(size_t(r.len_kv), -INFINITY);  // -inf where masked
  double m = -INFINITY;
  bool nan_score = false;
  auto move = [&](size_t) { return double(dir != 0 ? dir : (rng() & 1) ? 1 : -1); };
  for_each_score<1>(x, r, move, [&](int j, const std::array<float, 1>&, const std::array<float, 1>& v) {
    row[size_t(j)] = v[0];
    if (v[0] > m) m = v[0];
    nan_score |= std::isnan(v[0]);
  });
  if (max_score) *max_score = nan_score && m != INFINITY ? NAN : m;  // fa::reference_attention's rule
  std::fill_n(out, s.dim_v, 0.0);
  *lse = -INFINITY;
  if (m == -INFINITY && nan_score) {
    std::fill_n(out, s.dim_v, NAN);
    *lse = NAN;
    return;
  }
  if (m == -INFINITY) return;
  double sum = 0;
  for (int j = 0; j < r.len_kv; ++j) {
    if (row[j] == -INFINITY) continue;
    const double p = std::exp(row[j] - m);
    sum += p;
    const float* vr = &x.v.values[((size_t(r.b) * s.heads_kv + hk) * s.len_kv + j) * s.dim_v];
    for (int d = 0; d < s.dim_v; ++d) out[d] += p * vr[d];
  }
  for (int d = 0; d < s.dim_v; ++d) out[d] /= sum;
  *lse = m + std::log(sum);
}

// Does row r hold a key whose score the f32 accumulation bound can move by more than 1e-3
// (relative from 1 on) or tip into or out of NaN/±inf (at the bound's ends or at a score of
// exactly 0 between them), while it matters (within 20 of the row's largest score), or two keys
// that matter whose difference those moves can shift by more than 0.5 (P's ratio by e^0.5)? A
// discontinuous, chaotic or steep score_mod there (fmod by a near-zero score, a comparison on its
// edge, h / s · s at s = 0, pow(1951 + fmod(kv, s) % c, 8) at 2e26: seed 5301 case 7 of
// --tile-edges --kv-range --kv-linear, whose scores moved by 1e-4 of themselves, 2e22) has no
// answer at f32 that an envelope of a few samples could bound: such a row is unverifiable, not
// wrong. A lone top key far ahead of the others is not: the output is its V row whatever its
// score, and the envelope's moves cover its LSE.
bool unstable_row(const RowContext& x, const RowId& r) {
  std::vector<Moved> sc;  // each kept key's score under the probe's moves
  float top = -INFINITY;
  size_t at_top = 0;
  for_each_score<4>(x, r, probe_move, [&](int, const Moved&, const Moved& v) {
    for (float y : v)
      if (y > top) top = y, at_top = sc.size();
    sc.push_back(v);
  });
  auto range = [](const Moved& v) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return std::pair{*lo, *hi};
  };
  const float top_lo = sc.empty() ? top : range(sc[at_top]).first;
  const float top_width = top - top_lo;
  for (size_t k = 0; k < sc.size(); ++k) {
    const Moved& v = sc[k];
    const auto [lo, hi] = range(v);
    const bool finite = std::all_of(v.begin(), v.end(), [](float y) { return std::isfinite(y); });
    if (moves_apart(v) && (!finite || hi >= top - 20)) return true;
    // a second key that some move may bring within 20 of the top's lowest, the two together
    // moving by more than 0.5
    if (k != at_top && finite && hi >= top_lo - 20 && (hi - lo) + top_width > 0.5f) return true;
  }
  return false;
}

// How far a device may put the row's scores that matter (finite, within 20 of its largest) from
// the host's f32 evaluation: the score_mod again in f32 with every transcendental's result moved
// by ±4 ulps (CUDA's expf, exp2f, powf, logf, sinf, tanhf, erff, rsqrtf are within 1-4 ulps of
// the correctly rounded value: exact IEEE operations and sqrt move nothing). A mod may amplify
// that: pow(q, exp2(c)) at 1.6e5 moved the kernel's top scores, and with them its LSE, by 0.12
// (8 of its ulps; seed 5317 case 5 of --tile-edges --kv-range --kv-linear).
double mod_rounding(const RowContext& x, const RowId& r) {
  if (!x.c.score) return 0;  // (a case without the graph: compare_test's traced mods)
  struct Kept {
    int j;
    float in, sc;
  };
  std::vector<Kept> kept;
  float top = -INFINITY;
  for_each_score<1>(
      x, r, [](size_t) { return 0.0; },
      [&](int j, const std::array<float, 1>& in, const std::array<float, 1>& v) {
        if (!std::isfinite(v[0])) return;
        kept.push_back({j, in[0], v[0]});
        top = std::max(top, v[0]);
      });
  double worst = 0;
  for (const Kept& k : kept) {
    if (k.sc < top - 20) continue;
    const Point pt{r.b, r.h, r.i, k.j};
    const float base = eval_score<float>(x.c, x.c.score, k.in, pt);
    for (int ulps : {-4, 4}) {
      const float moved = eval_score<float>(x.c, x.c.score, k.in, pt, nullptr, nullptr, nullptr, false, ulps);
      if (std::isfinite(moved) && std::isfinite(base))
        worst = std::max(worst, std::fabs(double(moved) - base));
    }
  }
  return worst;
}

UnstableGradients unstable_gradients(const RowContext& x, const fa::BoundMod& grad,
                                     const std::vector<double>& lse) {
  const Shape& s = x.c.shape;
  const int group = s.heads_q / s.heads_kv;
  UnstableGradients u;
  u.dq_rows.assign(size_t(s.batch) * s.heads_q * s.len_q, 0);
  u.kv_rows.assign(size_t(s.batch) * s.heads_kv * s.len_kv, 0);
  // A row's kept keys: their f32 score inputs and scores under the probe's moves.
  struct Key {
    int j;
    Moved in, v;
  };
  std::vector<Key> keys;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h)
      for (int i = 0; i < s.len_q; ++i) {
        const size_t ri = (size_t(b) * s.heads_q + h) * s.len_q + i;
        const double l = lse[ri];
        if (l == -INFINITY) continue;  // no key: no gradient flows
        keys.clear();
        float top = -INFINITY;  // the row's largest score over the moves
        for_each_score<4>(x, {b, h, i, s.len_kv}, probe_move, [&](int j, const Moved& in, const Moved& v) {
          keys.push_back({j, in, v});
          for (float y : v) top = std::max(top, y);
        });
        for (const Key& key : keys) {
          // P is not 0 at one of the moves, from the kernel's LSE or the row's own largest
          // score: a kernel's forward may have seen a pole's score far from the reference's,
          // and its backward sees its own.
          bool flows = false;
          for (float y : key.v)
            flows |= !(std::exp(double(y) - l) < 0x1p-149) || !(double(y) < double(top) - 104);
          if (!flows) continue;
          Moved d;
          for (size_t k = 0; k < d.size(); ++k)
            d[k] = grad.score_grad(key.in[k], b, h, i, key.j, 1.0f, nullptr);
          if (!scores_move_apart(key.v) && !moves_apart(d)) continue;
          ++u.pairs;
          u.dq_rows[ri] = 1;
          u.kv_rows[(size_t(b) * s.heads_kv + h / group) * s.len_kv + key.j] = 1;
        }
      }
  return u;
}

// The LSE bound: 2e-2 absolute, plus what f32 can hold of a large LSE (it is stored as f32 and
// formed as (R + log2 l)·ln 2: a few of its ulps).
double lse_bound(double ref) { return 2e-2 + std::fabs(ref) * 0x1p-21; }

// The max_scores bound: what unstable_row lets a score move (1e-3, relative from 1 on), plus a
// few of f32's ulps (the kernels keep the max in log2 units and convert it back).
double max_bound(double ref) { return 1e-3 * std::max(1.0, std::fabs(ref)) + std::fabs(ref) * 0x1p-21; }

bool same_nonfinite(double got, double ref) {
  return (std::isnan(ref) && std::isnan(got)) || (std::isinf(ref) && got == ref);
}

namespace {
// Whether the kernel's g lies within `slack` of the span of the finite ones of the reference and
// its three moved re-evaluations, NaN or ±inf only where one of them is.
bool inside_span(double g, const std::array<double, 4>& values, double slack) {
  double lo = INFINITY, hi = -INFINITY;
  bool nonfinite_ok = false;
  for (double w : values) {
    if (std::isfinite(w))
      lo = std::min(lo, w), hi = std::max(hi, w);
    else
      nonfinite_ok |= same_nonfinite(g, w);
  }
  if (!std::isfinite(g)) return nonfinite_ok;
  return lo <= hi && g >= lo - slack && g <= hi + slack;
}
}  // namespace

// Is row r of the kernel inside the reference's envelope: each element (and the LSE) within
// the bound of the span of the reference and its three perturbed re-evaluations, NaN or ±inf
// only where one of them is?
bool inside_envelope(const RowContext& x, const RowId& r, const double* got, double got_lse,
                     const double* ref, double ref_lse, double tol, std::mt19937_64& rng) {
  const int DV = x.c.shape.dim_v;
  std::vector<std::vector<double>> outs(4, std::vector<double>(ref, ref + DV));
  std::vector<double> lses(4, ref_lse);
  for (int dir = -1; dir <= 1; ++dir)
    reference_row(x, r, dir, rng, outs[size_t(dir + 2)].data(), &lses[size_t(dir + 2)]);
  double mag = 0;
  for (int d = 0; d < DV; ++d)
    if (std::isfinite(ref[d])) mag = std::max(mag, std::fabs(ref[d]));
  for (size_t d = 0; d < size_t(DV); ++d)
    if (!inside_span(got[d], {outs[0][d], outs[1][d], outs[2][d], outs[3][d]}, tol * std::max(mag, 1e-3)))
      return false;
  return inside_span(got_lse, {lses[0], lses[1], lses[2], lses[3]}, lse_bound(ref_lse));
}

// The forward's check over rows (out [rows][Dv], lse [rows]): out relative error (2-norm over
// the finite reference entries) within `tol`, LSE within lse_bound, NaN/inf only where the
// reference has them. Rows over the bound (worst first, up to 2e7 query-key pairs) are re-evaluated under
// the f32 accumulation envelope (reference_row); those inside it are ill-conditioned — a
// score_mod amplifying rounding — and left out of the verdict, counted in `st`.
std::string compare_forward(const RowContext& x, const std::vector<RowId>& rows,
                            const std::vector<double>& got, const std::vector<double>& ref,
                            const std::vector<double>& got_lse, const std::vector<double>& ref_lse,
                            double tol, std::mt19937_64& rng, Stats* st) {
  const size_t DV = size_t(x.c.shape.dim_v), n = rows.size();
  std::vector<double> num(n, 0), den(n, 0);
  std::vector<char> bad(n, 0);       // a non-finite mismatch or an LSE over its bound
  std::vector<char> lse_only(n, 0);  // of those, a finite LSE over its bound and nothing else
  for (size_t r = 0; r < n; ++r) {
    for (size_t d = 0; d < DV; ++d) {
      const double g = got[r * DV + d], w = ref[r * DV + d];
      if (!std::isfinite(g) || !std::isfinite(w)) {
        bad[r] |= !same_nonfinite(g, w);
        continue;
      }
      num[r] += (g - w) * (g - w), den[r] += w * w;
    }
    const double gl = got_lse[r], wl = ref_lse[r];
    const bool finite = std::isfinite(gl) && std::isfinite(wl);
    const bool lse_off = finite ? std::fabs(gl - wl) > lse_bound(wl) : !same_nonfinite(gl, wl);
    lse_only[r] = finite && lse_off && !bad[r];
    bad[r] |= lse_off;
  }
  std::vector<char> left_out(n, 0);
  auto verdict = [&](size_t* worst_row) {
    double tn = 0, td = 0;
    bool any_bad = false;
    double worst = -1;
    for (size_t r = 0; r < n; ++r) {
      if (left_out[r]) continue;
      tn += num[r], td += den[r];
      const double e = bad[r] ? INFINITY : num[r] / std::max(den[r], 1e-30);
      if (e > worst) worst = e, *worst_row = r;
      any_bad |= bad[r] != 0;
    }
    const double rel = td > 0 ? std::sqrt(tn / td) : std::sqrt(tn);
    return std::pair{!any_bad && rel <= tol, rel};
  };
  size_t worst_row = 0;
  if (verdict(&worst_row).first) return "";
  // Suspects: the rows over the bound themselves, worst first.
  std::vector<size_t> suspects;
  for (size_t r = 0; r < n; ++r)
    if (bad[r] || num[r] > 0.25 * tol * tol * den[r] + 1e-12) suspects.push_back(r);
  std::sort(suspects.begin(), suspects.end(), [&](size_t a, size_t b) {
    auto key = [&](size_t r) { return bad[r] ? INFINITY : num[r] / std::max(den[r], 1e-30); };
    return key(a) > key(b);
  });
  int64_t ill = 0, lse_by_mod = 0;
  // Re-evaluated rows, worst first, within a budget of 2e7 query-key pairs (a full reference's).
  int64_t pairs = 0;
  for (size_t k = 0; k < suspects.size() && pairs < 20000000; ++k) {
    const size_t r = suspects[k];
    pairs += rows[r].len_kv;
    // A row whose output is within the bound and whose LSE is off by no more than the bound
    // plus twice what a device's transcendentals may move its top scores (mod_rounding) passes.
    if (lse_only[r] && num[r] <= tol * tol * den[r] + 1e-12 &&
        std::fabs(got_lse[r] - ref_lse[r]) <= lse_bound(ref_lse[r]) + 2 * mod_rounding(x, rows[r])) {
      bad[r] = 0, ++lse_by_mod;
      continue;
    }
    if (inside_envelope(x, rows[r], &got[r * DV], got_lse[r], &ref[r * DV], ref_lse[r], tol, rng) ||
        unstable_row(x, rows[r]))
      left_out[r] = 1, ++ill;
  }
  const auto [ok, rel] = verdict(&worst_row);
  if (st) st->ill_rows += ill, st->ill_cases += ill > 0, st->lse_mod_rows += lse_by_mod;
  if (ok) return "";
  size_t wd = 0;
  double we = -1;
  for (size_t d = 0; d < DV; ++d) {
    const double g = got[worst_row * DV + d], w = ref[worst_row * DV + d];
    const double e = std::isfinite(g) && std::isfinite(w) ? std::fabs(g - w)
                     : same_nonfinite(g, w)               ? 0
                                                          : INFINITY;
    if (e > we) we = e, wd = d;
  }
  const RowId& wr = rows[worst_row];
  size_t n_bad = 0;
  for (size_t r = 0; r < n; ++r) n_bad += bad[r] && !left_out[r];
  return fmt::format(
      "out rel err {:.3e} (bound {:.0e}), {} rows with a non-finite mismatch or lse over its bound; {} of {} "
      "rows over the bound inside the reference's f32 envelope (ill-conditioned, left out)\n"
      "  worst row: out got {:.6g}, want {:.6g} at d {}; lse got {:.8g}, want {:.8g}\n  {}",
      rel, tol, n_bad, ill, suspects.size(), got[worst_row * DV + wd], ref[worst_row * DV + wd], wd,
      got_lse[worst_row], ref_lse[worst_row], describe_row(x, wr));
}

// Each row's largest score against the reference's: within max_bound, NaN/±inf where it has
// them. Rows over it are re-evaluated (worst first, up to 2e7 query-key pairs) with every q·k
// moved as reference_row moves it; a max inside the span of the moved maxima (plus the bound),
// or in an unstable row, is ill-conditioned, counted, not a mismatch.
std::string compare_max_scores(const RowContext& x, const std::vector<RowId>& rows,
                               const std::vector<double>& got, const std::vector<double>& ref,
                               std::mt19937_64 rng, Stats* st) {
  auto error_of = [&](size_t r) {
    return std::isfinite(got[r]) && std::isfinite(ref[r]) ? std::fabs(got[r] - ref[r]) / max_bound(ref[r])
           : same_nonfinite(got[r], ref[r])               ? 0.0
                                                          : INFINITY;
  };
  std::vector<size_t> over;
  for (size_t r = 0; r < rows.size(); ++r)
    if (error_of(r) > 1) over.push_back(r);
  if (over.empty()) return "";
  std::sort(over.begin(), over.end(), [&](size_t a, size_t b) { return error_of(a) > error_of(b); });
  std::vector<double> out(size_t(x.c.shape.dim_v));
  int64_t pairs = 0, ill = 0;
  size_t bad = 0, first_bad = over[0];
  for (size_t r : over) {
    bool left_out = false;
    if (pairs < 20000000) {
      pairs += rows[r].len_kv;
      std::array<double, 4> maxes{ref[r]};  // the reference and its three moved re-evaluations
      for (int dir = -1; dir <= 1; ++dir) {
        double lse = 0;
        reference_row(x, rows[r], dir, rng, out.data(), &lse, &maxes[size_t(dir + 2)]);
      }
      left_out = inside_span(got[r], maxes, max_bound(ref[r])) || unstable_row(x, rows[r]);
    }
    if (left_out)
      ++ill;
    else if (bad++ == 0)
      first_bad = r;
  }
  if (st) st->ill_rows += ill, st->ill_cases += ill > 0;
  if (bad == 0) return "";
  return fmt::format(
      "{} rows' max_scores over the bound 1e-3·max(1, |max|) ({} more inside the reference's f32 "
      "envelope)\n  first: got {:.8g}, want {:.8g}\n  {}",
      bad, ill, got[first_bad], ref[first_bad], describe_row(x, rows[first_bad]));
}

}  // namespace fa_fuzz
