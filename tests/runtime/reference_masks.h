// Brute-force references for block-mask tests: classify tiles element by element on the
// host and build the eight tables with plain loops, independently of fa::BlockMask.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "fajit/block_mask.h"

namespace fa::test {

using MaskFn = std::function<bool(int b, int h, int q, int kv)>;

inline std::vector<uint8_t> reference_kinds(const MaskFn& mask, int bm, int hm, int len_q, int len_kv,
                                            int q_block, int kv_block) {
  const int nq = (len_q + q_block - 1) / q_block, nkv = (len_kv + kv_block - 1) / kv_block;
  std::vector<uint8_t> kinds(size_t(bm) * hm * nq * nkv);
  size_t t = 0;
  for (int b = 0; b < bm; ++b)
    for (int h = 0; h < hm; ++h)
      for (int qb = 0; qb < nq; ++qb)
        for (int kb = 0; kb < nkv; ++kb) {
          bool any_t = false, any_f = false;
          for (int q = qb * q_block; q < len_q && q < (qb + 1) * q_block && !(any_t && any_f); ++q)
            for (int kv = kb * kv_block; kv < len_kv && kv < (kb + 1) * kv_block; ++kv) {
              if (mask(b, h, q, kv))
                any_t = true;
              else
                any_f = true;
              if (any_t && any_f) break;
            }
          kinds[t++] = any_t && any_f ? 1 : any_t ? 2 : 0;
        }
  return kinds;
}

struct ReferenceTables {
  std::vector<int32_t> kv_num, kv_idx, full_kv_num, full_kv_idx;
  std::vector<int32_t> q_num, q_idx, full_q_num, full_q_idx;
};

// Rows along kv for each q block, then columns along q for each kv block, padded with 0.
inline ReferenceTables reference_tables(const std::vector<uint8_t>& kinds, int bm, int hm, int nq, int nkv) {
  ReferenceTables r;
  const size_t g_count = size_t(bm) * hm;
  r.kv_num.assign(g_count * nq, 0);
  r.full_kv_num.assign(g_count * nq, 0);
  r.kv_idx.assign(g_count * nq * nkv, 0);
  r.full_kv_idx.assign(g_count * nq * nkv, 0);
  r.q_num.assign(g_count * nkv, 0);
  r.full_q_num.assign(g_count * nkv, 0);
  r.q_idx.assign(g_count * nkv * nq, 0);
  r.full_q_idx.assign(g_count * nkv * nq, 0);
  for (size_t g = 0; g < g_count; ++g) {
    auto at = [&](int qb, int kb) { return kinds[(g * nq + qb) * nkv + kb]; };
    for (int qb = 0; qb < nq; ++qb) {
      int np = 0, nf = 0;
      for (int kb = 0; kb < nkv; ++kb) {
        if (at(qb, kb) == 1) r.kv_idx[(g * nq + qb) * nkv + np++] = kb;
        if (at(qb, kb) == 2) r.full_kv_idx[(g * nq + qb) * nkv + nf++] = kb;
      }
      r.kv_num[g * nq + qb] = np;
      r.full_kv_num[g * nq + qb] = nf;
    }
    for (int kb = 0; kb < nkv; ++kb) {
      int np = 0, nf = 0;
      for (int qb = 0; qb < nq; ++qb) {
        if (at(qb, kb) == 1) r.q_idx[(g * nkv + kb) * nq + np++] = qb;
        if (at(qb, kb) == 2) r.full_q_idx[(g * nkv + kb) * nq + nf++] = qb;
      }
      r.q_num[g * nkv + kb] = np;
      r.full_q_num[g * nkv + kb] = nf;
    }
  }
  return r;
}

// All eight tables of `m` equal the brute-force ones.
inline void expect_tables(const BlockMask& m, const ReferenceTables& r) {
  EXPECT_EQ(m.kv_num_blocks(), r.kv_num);
  EXPECT_EQ(m.kv_indices(), r.kv_idx);
  EXPECT_EQ(m.full_kv_num_blocks(), r.full_kv_num);
  EXPECT_EQ(m.full_kv_indices(), r.full_kv_idx);
  EXPECT_EQ(m.q_num_blocks(), r.q_num);
  EXPECT_EQ(m.q_indices(), r.q_idx);
  EXPECT_EQ(m.full_q_num_blocks(), r.full_q_num);
  EXPECT_EQ(m.full_q_indices(), r.full_q_idx);
}

}  // namespace fa::test
