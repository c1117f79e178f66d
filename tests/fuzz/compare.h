// The fuzzer's float64 comparisons (tests/fuzz/README.md, GPU mode), kept apart from the GPU so
// they are tested without one (compare_test.cpp): elementwise comparison with NaN/inf matched,
// the forward's row-wise verdict with the reference's own f32 rounding envelope for
// ill-conditioned mods, and the descriptions failures print.
#ifndef FAJIT_TESTS_FUZZ_COMPARE_H
#define FAJIT_TESTS_FUZZ_COMPARE_H

#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "fajit/detail/interp.h"
#include "fajit/detail/reference.h"
#include "fajit/frontend.h"
#include "fajit/runtime/half.h"
#include "fuzz.h"

namespace fa_fuzz {

struct Compared {
  double rel = 0;         // ||got - ref|| / ||ref|| over the entries where ref is finite
  size_t unexpected = 0;  // non-finite where the reference is finite, or finite where it is not
  size_t first_bad = 0;
};
Compared compare(const std::vector<double>& got, const std::vector<double>& ref);

// The element with the largest error (or the first non-finite mismatch) of `got` vs `ref`.
size_t worst(const std::vector<double>& got, const std::vector<double>& ref);

// A query row of the comparison: batch b, head h, query i over its first len_kv keys (the dense
// case: all of them; a ragged sequence: its own).
struct RowId {
  int b, h, i, len_kv;
};

// What the forward comparison needs to re-evaluate rows: the case (its shape), the bound mods
// and the inputs (contiguous [B, H, L, D] values).
struct RowContext {
  const Case& c;
  const fa::BoundMod& score;
  const fa::BoundMod& mask;
  const fa::RoundedTensor &q, &k, &v;
};

// How far a device may put the row's scores that matter (within 20 of the top) from the host's
// f32 evaluation: the score_mod with every transcendental's result moved by ±4 ulps
// (compare_forward's LSE slack).
double mod_rounding(const RowContext& x, const RowId& r);
// What the float64 reference saw in query row r: masked keys, NaN and ±inf scores and the range
// of the finite ones.
std::string describe_row(const RowContext& x, const RowId& r);
// One row of the float64 reference, each q·k first moved by dir·Dqk·2^-24·Σ|q_d·k_d| (dir +1,
// -1, or random signs per key when 0): out [Dv], lse and (if asked) the row's largest score.
void reference_row(const RowContext& x, const RowId& r, int dir, std::mt19937_64& rng, double* out,
                   double* lse, double* max_score = nullptr);
// Whether the row holds a key whose score those moves change by more than 1e-3 (relative from
// 1) or tip into or out of NaN/±inf — at their ends or at a score of exactly 0 between them,
// where an f32 sum may land (h / s · s) — while it matters (within 20 of the row max), or a
// second key that some move brings within 20 of the top key's lowest while the two move by more
// than 0.5 together (a steep or chaotic mod: P's ratio moves by e^0.5 whatever the scores' size).
bool unstable_row(const RowContext& x, const RowId& r);
// The backward's pairs with no answer at f32: (b, h, i, j) whose score or derivative
// (score_grad with dt = 1) the moves above change by more than 1e-3 (relative from 1 on) or
// tip into or out of NaN/±inf (also at a score of exactly 0 between the moves' ends), or whose
// score they move by more than 0.5 (P by e^0.5, a
// steep mod: pow(86, score) at 3e4), while P = exp(score - LSE) is not 0 at one of the moves — a
// pole of the score_mod at a score near 0 (c / s, where the kernel's f32 q·k may sit on the
// other side of it), a kink or a chaotic mod. The gradient rows they feed are unverifiable:
// dQ row (b, h, i), dK and dV row (b, h / group, j), and every buffer gradient.
struct UnstableGradients {
  std::vector<char> dq_rows;  // [B·Hq·Lq]
  std::vector<char> kv_rows;  // [B·Hkv·Lkv]
  size_t pairs = 0;
};
// lse: [B·Hq·Lq], the LSE the backward's P comes from (the kernel's).
UnstableGradients unstable_gradients(const RowContext& x, const fa::BoundMod& grad,
                                     const std::vector<double>& lse);
// The LSE bound: 2e-2 absolute plus a few of f32's ulps of |ref|.
double lse_bound(double ref);
// The max_scores bound: 1e-3 (relative from 1 on) plus a few f32 ulps of |ref|.
double max_bound(double ref);
bool same_nonfinite(double got, double ref);
// Whether row r of the kernel (got [Dv], got_lse) lies inside the span of the reference and its
// three moved re-evaluations (plus the bound), non-finite only where one of them is.
bool inside_envelope(const RowContext& x, const RowId& r, const double* got, double got_lse,
                     const double* ref, double ref_lse, double tol, std::mt19937_64& rng);
// The forward's verdict over rows (out [rows][Dv], lse [rows]): "" or the failure text. Rows
// over the bound are re-evaluated (worst first, up to 2e7 query-key pairs): one whose output is
// within the bound and whose LSE is within the bound plus 2·mod_rounding passes (counted in
// st->lse_mod_rows); those inside the envelope or unstable are left out, counted in
// st->ill_rows / ill_cases.
std::string compare_forward(const RowContext& x, const std::vector<RowId>& rows,
                            const std::vector<double>& got, const std::vector<double>& ref,
                            const std::vector<double>& got_lse, const std::vector<double>& ref_lse,
                            double tol, std::mt19937_64& rng, Stats* st);

// Each row's largest score (ForwardOptions::max_scores, [rows]) against the reference's: "" or
// the failure text. Rows over max_bound inside the moved references' span or unstable are left
// out, counted in st->ill_rows / ill_cases. `rng` is a copy: the case's own stream is untouched.
std::string compare_max_scores(const RowContext& x, const std::vector<RowId>& rows,
                               const std::vector<double>& got, const std::vector<double>& ref,
                               std::mt19937_64 rng, Stats* st);

}  // namespace fa_fuzz

#endif  // FAJIT_TESTS_FUZZ_COMPARE_H
