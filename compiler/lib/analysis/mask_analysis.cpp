// fa::analyze_block_mask: the quadtree over the block grid and the witness search for single
// undecided blocks, on top of the mask range program (fajit/analysis/range_program.h).
#include "fajit/detail/mask_analysis.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "fajit/analysis/range_program.h"
#include "fajit/detail/reference.h"
#include "fajit/error.h"

namespace fa {
namespace detail {
namespace {

constexpr int kLeafBudget = 512;  // interval evaluations per undecided block

struct Classifier {
  Evaluator& ev;
  const RangeFields& f;
  IndexRange b, h;
  int64_t len_q, len_kv;
  int q_block, kv_block, nkv;
  uint8_t* kinds;  // [nq, nkv] of this (b, h)
  int64_t undecided = 0;

  IndexRange qrange(int qb0, int qb1) const {
    return {int64_t(qb0) * q_block, std::min<int64_t>(int64_t(qb1) * q_block, len_q) - 1};
  }
  IndexRange krange(int kb0, int kb1) const {
    return {int64_t(kb0) * kv_block, std::min<int64_t>(int64_t(kb1) * kv_block, len_kv) - 1};
  }
  void fill(int qb0, int qb1, int kb0, int kb1, BlockKind kind) {
    if (kind == BlockKind::kUndecided) undecided += int64_t(qb1 - qb0) * (kb1 - kb0);
    for (int qb = qb0; qb < qb1; ++qb)
      std::memset(kinds + size_t(qb) * nkv + kb0, int(kind), size_t(kb1 - kb0));
  }

  // Regions of blocks [qb0, qb1) x [kb0, kb1): decided ones are filled; undecided single
  // blocks go to the witness search. Returns false when the region stayed unknown.
  void region(int qb0, int qb1, int kb0, int kb1) {
    MaskVerdict v = ev.eval(b, h, qrange(qb0, qb1), krange(kb0, kb1));
    if (v != MaskVerdict::kUnknown) {
      fill(qb0, qb1, kb0, kb1, v == MaskVerdict::kTrue ? BlockKind::kFull : BlockKind::kEmpty);
      return;
    }
    if (qb1 - qb0 == 1 && kb1 - kb0 == 1) {
      const BlockKind k = leaf(qrange(qb0, qb1), krange(kb0, kb1));
      kinds[size_t(qb0) * nkv + kb0] = uint8_t(k);
      undecided += k == BlockKind::kUndecided;
      return;
    }
    const int qm = qb1 - qb0 > 1 ? (qb0 + qb1) / 2 : qb1;
    const int km = kb1 - kb0 > 1 ? (kb0 + kb1) / 2 : kb1;
    if (f.opaque) {
      // Data-dependent bodies: stop splitting where no child is decided (deeper levels
      // would not be either when the unknown comes from a load); leave it undecided.
      bool any = false;
      int ch[4][4] = {{qb0, qm, kb0, km}, {qb0, qm, km, kb1}, {qm, qb1, kb0, km}, {qm, qb1, km, kb1}};
      for (auto& c : ch)
        if (c[0] < c[1] && c[2] < c[3] &&
            ev.eval(b, h, qrange(c[0], c[1]), krange(c[2], c[3])) != MaskVerdict::kUnknown)
          any = true;
      if (!any) {
        fill(qb0, qb1, kb0, kb1, BlockKind::kUndecided);
        return;
      }
    }
    region(qb0, qm, kb0, km);
    if (km < kb1) region(qb0, qm, km, kb1);
    if (qm < qb1) {
      region(qm, qb1, kb0, km);
      if (km < kb1) region(qm, qb1, km, kb1);
    }
  }

  // One block the interval analysis left unknown: look for an element where the mask holds
  // and one where it does not (partial), or prove by exhaustion that it is full or empty.
  BlockKind leaf(IndexRange q, IndexRange k) {
    bool seen_true = false, seen_false = false;
    auto point = [&](int64_t qi, int64_t ki) {
      MaskVerdict v = ev.eval(b, h, {qi, qi}, {ki, ki});
      if (v == MaskVerdict::kTrue)
        seen_true = true;
      else if (v == MaskVerdict::kFalse)
        seen_false = true;
      return v != MaskVerdict::kUnknown;
    };
    if (b.lo != b.hi || h.lo != h.hi) return BlockKind::kUndecided;
    const int64_t qc = (q.lo + q.hi) / 2, kc = (k.lo + k.hi) / 2;
    // Undecided as soon as the interval program is unknown on a point.
    if (!point(q.lo, k.hi) || !point(q.hi, k.lo)) return BlockKind::kUndecided;
    if (seen_true && seen_false) return BlockKind::kPartial;
    if (!point(q.lo, k.lo) || !point(q.hi, k.hi) || !point(qc, kc)) return BlockKind::kUndecided;
    if (seen_true && seen_false) return BlockKind::kPartial;
    struct Box {
      IndexRange q, k;
    };
    Box stack[64 * 4];
    int top = 0;
    stack[top++] = {q, k};
    int budget = kLeafBudget;
    while (top > 0) {
      Box bx = stack[--top];
      const int64_t qm = bx.q.lo + (bx.q.hi - bx.q.lo) / 2, km = bx.k.lo + (bx.k.hi - bx.k.lo) / 2;
      Box ch[4];
      int n = 0;
      const bool sq = bx.q.hi > bx.q.lo, sk = bx.k.hi > bx.k.lo;
      if (sq && sk) {
        ch[n++] = {{bx.q.lo, qm}, {bx.k.lo, km}};
        ch[n++] = {{bx.q.lo, qm}, {km + 1, bx.k.hi}};
        ch[n++] = {{qm + 1, bx.q.hi}, {bx.k.lo, km}};
        ch[n++] = {{qm + 1, bx.q.hi}, {km + 1, bx.k.hi}};
      } else if (sq) {
        ch[n++] = {{bx.q.lo, qm}, bx.k};
        ch[n++] = {{qm + 1, bx.q.hi}, bx.k};
      } else {
        ch[n++] = {bx.q, {bx.k.lo, km}};
        ch[n++] = {bx.q, {km + 1, bx.k.hi}};
      }
      for (int i = 0; i < n; ++i) {
        if (--budget < 0) return BlockKind::kUndecided;
        MaskVerdict v = ev.eval(b, h, ch[i].q, ch[i].k);
        if (v == MaskVerdict::kTrue)
          seen_true = true;
        else if (v == MaskVerdict::kFalse)
          seen_false = true;
        else if (ch[i].q.lo == ch[i].q.hi && ch[i].k.lo == ch[i].k.hi)
          return BlockKind::kUndecided;
        else if (top < int(sizeof stack / sizeof stack[0]))
          stack[top++] = ch[i];
        else
          return BlockKind::kUndecided;
        if (seen_true && seen_false) return BlockKind::kPartial;
      }
    }
    // Every element was covered by a decided box.
    return seen_true && seen_false ? BlockKind::kPartial : seen_true ? BlockKind::kFull : BlockKind::kEmpty;
  }
};

}  // namespace
}  // namespace detail

MaskAnalysis analyze_block_mask(const MaskRangeProgram& program, int batch, int heads, int64_t len_q,
                                int64_t len_kv, int q_block, int kv_block, const ScalarValues& scalars) {
  if (batch < 1 || heads < 1 || len_q < 1 || len_kv < 1)
    throw Error(fmt::format("block mask needs positive sizes, got B={} H={} Lq={} Lkv={}", batch, heads,
                            len_q, len_kv));
  if (q_block < 1 || kv_block < 1)
    throw Error(fmt::format("block sizes must be positive, got {}x{}", q_block, kv_block));
  if (len_q > std::numeric_limits<int32_t>::max() || len_kv > std::numeric_limits<int32_t>::max())
    throw Error(fmt::format("lengths must be below 2^31, got Lq={} Lkv={}", len_q, len_kv));
  const detail::RangeFields& f = program.fields();
  MaskAnalysis a;
  a.batch = f.reads_b ? batch : 1;
  a.heads = f.reads_h ? heads : 1;
  a.num_q_blocks = static_cast<int>((len_q + q_block - 1) / q_block);
  a.num_kv_blocks = static_cast<int>((len_kv + kv_block - 1) / kv_block);
  a.reads_buffers = f.reads_buffers;
  const size_t per = size_t(a.num_q_blocks) * a.num_kv_blocks;
  if (size_t(a.batch) * a.heads * per > size_t(std::numeric_limits<int32_t>::max()))
    throw Error(
        fmt::format("block mask: {} x {} x {} x {} tiles exceed the int32 range (larger blocks or "
                    "shorter lengths)",
                    a.batch, a.heads, a.num_q_blocks, a.num_kv_blocks));
  a.kinds.resize(size_t(a.batch) * a.heads * per);  // every block is written below
  detail::Evaluator ev(f, scalars);
  // A mask reading b or h only through its loads (a document mask's doc[b, q]) keeps one table
  // per (b, h), but every one is decided alike: the first such is analysed, the rest copied.
  const int bn = f.verdict_reads_b ? a.batch : 1, hn = f.verdict_reads_h ? a.heads : 1;
  for (int bi = 0; bi < a.batch; ++bi)
    for (int hi = 0; hi < a.heads; ++hi) {
      uint8_t* kinds = a.kinds.data() + (size_t(bi) * a.heads + hi) * per;
      if (bi >= bn || hi >= hn) {
        const uint8_t* same = a.kinds.data() + (size_t(bi % bn) * a.heads + hi % hn) * per;
        std::memcpy(kinds, same, per);
        a.undecided += int64_t(std::count(same, same + per, uint8_t(BlockKind::kUndecided)));
        continue;
      }
      detail::Classifier c{ev,     f,       {bi, bi}, {hi, hi},        len_q,
                           len_kv, q_block, kv_block, a.num_kv_blocks, kinds};
      c.region(0, a.num_q_blocks, 0, a.num_kv_blocks);
      a.undecided += c.undecided;
    }
  a.decided = int64_t(a.kinds.size()) - a.undecided;
  a.evaluations = ev.evaluations;
  return a;
}

MaskAnalysis analyze_block_mask(const Program& program, int batch, int heads, int64_t len_q, int64_t len_kv,
                                int q_block, int kv_block, const Captures& captures) {
  return analyze_block_mask(MaskRangeProgram::compile(program), batch, heads, len_q, len_kv, q_block,
                            kv_block, scalar_values_of(captures));
}

int64_t evaluate_undecided_blocks(MaskAnalysis& a, const ModProgram& mask, const Bindings& bindings,
                                  int64_t len_q, int64_t len_kv, int q_block, int kv_block) {
  if (a.undecided == 0) return 0;
  const BoundMod m = mask.bind(bindings);
  const size_t per = size_t(a.num_q_blocks) * a.num_kv_blocks;
  int64_t n = 0;
  for (int bi = 0; bi < a.batch; ++bi)
    for (int hi = 0; hi < a.heads; ++hi)
      for (int qb = 0; qb < a.num_q_blocks; ++qb)
        for (int kb = 0; kb < a.num_kv_blocks; ++kb) {
          uint8_t& kind = a.kinds[(size_t(bi) * a.heads + hi) * per + size_t(qb) * a.num_kv_blocks + kb];
          if (kind != uint8_t(BlockKind::kUndecided)) continue;
          const int q0 = qb * q_block, k0 = kb * kv_block;
          const int q1 = static_cast<int>(std::min<int64_t>(len_q, int64_t(q0) + q_block));
          const int k1 = static_cast<int>(std::min<int64_t>(len_kv, int64_t(k0) + kv_block));
          kind = uint8_t(detail::brute_force_block_kind(m, bi, hi, q0, q1, k0, k1));
          ++n;
        }
  a.decided += n;
  a.undecided -= n;
  return n;
}

}  // namespace fa
