#include "fajit/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>

#include "fajit/error.h"
#include "fajit/params.h"
#include "fajit/runtime/fwd_params.h"
#include "fajit/runtime/tma.h"
#include "fajit/sequences.h"

namespace {

using fa::DType;
using fa::TensorView;

// Fake, 256-byte aligned device addresses: validation never dereferences them.
void* addr(uintptr_t i) { return reinterpret_cast<void*>(0x10000000 + i * 0x1000000); }

struct Views {
  TensorView q{addr(0), DType::bf16, {2, 8, 100, 64}};
  TensorView k{addr(1), DType::bf16, {2, 2, 300, 64}};
  TensorView v{addr(2), DType::bf16, {2, 2, 300, 32}};
  TensorView o{addr(3), DType::bf16, {2, 8, 100, 32}};
  TensorView lse{addr(4), DType::f32, {2, 8, 100}};
};

std::string error_of(const Views& t, bool with_lse = true) {
  try {
    fa::validate_attention(t.q, t.k, t.v, t.o, with_lse ? &t.lse : nullptr);
  } catch (const fa::Error& e) {
    EXPECT_EQ(e.code(), fa::ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(TensorView, ContiguousStrides) {
  TensorView t(addr(0), DType::f16, {2, 3, 4, 8});
  EXPECT_EQ(t.rank, 4);
  EXPECT_EQ(t.stride[0], 96);
  EXPECT_EQ(t.stride[1], 32);
  EXPECT_EQ(t.stride[2], 8);
  EXPECT_EQ(t.stride[3], 1);
  EXPECT_EQ(t.numel(), 192);
  EXPECT_EQ(t.to_string(), "f16[2, 3, 4, 8] strides [96, 32, 8, 1]");
}

TEST(TensorView, RejectsRankAboveFour) {
  try {
    TensorView t(addr(0), DType::f16, {1, 2, 3, 4, 5});
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_STREQ(e.what(), "tensor view: at most 4 dimensions are supported, got 5");
  }
  try {
    TensorView t(addr(0), DType::f16, {1, 2}, {2});
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_STREQ(e.what(), "tensor view: 1 strides given for 2 dimensions");
  }
}

TEST(DType, NamesAndSizes) {
  EXPECT_STREQ(fa::dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(fa::dtype_name(DType::boolean), "bool");
  EXPECT_EQ(fa::dtype_size(DType::f16), 2);
  EXPECT_EQ(fa::dtype_size(DType::i64), 8);
  EXPECT_EQ(fa::dtype_size(DType::u8), 1);
}

TEST(ValidateAttention, AcceptsGqaShapes) {
  Views t;
  fa::AttentionShape s = fa::validate_attention(t.q, t.k, t.v, t.o, &t.lse);
  EXPECT_EQ(s.batch, 2);
  EXPECT_EQ(s.heads_q, 8);
  EXPECT_EQ(s.heads_kv, 2);
  EXPECT_EQ(s.len_q, 100);
  EXPECT_EQ(s.len_kv, 300);
  EXPECT_EQ(s.dim_qk, 64);
  EXPECT_EQ(s.dim_v, 32);
  EXPECT_EQ(s.dtype, DType::bf16);
  EXPECT_EQ(error_of(t, false), "");
}

TEST(ValidateAttention, Ranks) {
  Views t;
  t.q = TensorView(addr(0), DType::bf16, {8, 100, 64});
  EXPECT_EQ(error_of(t), "q: expected 4 dimensions [B, Hq, Lq, Dqk], got 3");
  t = Views();
  t.k = TensorView(addr(1), DType::bf16, {2, 2, 300});
  EXPECT_EQ(error_of(t), "k: expected 4 dimensions [B, Hkv, Lkv, Dqk], got 3");
  t = Views();
  t.v = TensorView(addr(2), DType::bf16, {300, 32});
  EXPECT_EQ(error_of(t), "v: expected 4 dimensions [B, Hkv, Lkv, Dv], got 2");
  t = Views();
  t.o = TensorView();
  EXPECT_EQ(error_of(t), "o: expected 4 dimensions [B, Hq, Lq, Dv], got 0");
  t = Views();
  t.lse = TensorView(addr(4), DType::f32, {2, 8, 100, 1});
  EXPECT_EQ(error_of(t), "lse: expected 3 dimensions [B, Hq, Lq], got 4");
}

TEST(ValidateAttention, NullPointers) {
  Views t;
  t.v.data = nullptr;
  EXPECT_EQ(error_of(t), "v: data pointer is null");
  t = Views();
  t.lse.data = nullptr;
  EXPECT_EQ(error_of(t), "lse: data pointer is null");
}

TEST(ValidateAttention, ZeroAndHugeSizes) {
  Views t;
  t.q = TensorView(addr(0), DType::bf16, {2, 8, 0, 64});
  EXPECT_EQ(error_of(t), "q: Lq must be positive, got 0");
  t = Views();
  t.k = TensorView(addr(1), DType::bf16, {2, 2, 300, 64}, {0, 0, 64, 1});
  t.k.shape[2] = 3000000000LL;
  EXPECT_EQ(error_of(t), "k: Lkv = 3000000000 exceeds the int32 range");
  t = Views();
  t.q = TensorView(addr(0), DType::bf16, {70000, 40000, 1, 64}, {0, 0, 0, 1});
  t.o = TensorView(addr(3), DType::bf16, {70000, 40000, 1, 32}, {0, 0, 0, 1});
  t.k = TensorView(addr(1), DType::bf16, {70000, 2, 300, 64});
  t.v = TensorView(addr(2), DType::bf16, {70000, 2, 300, 32});
  EXPECT_EQ(error_of(t, false), "q: B*Hq = 2800000000 exceeds the int32 range");
}

TEST(ValidateAttention, Strides) {
  Views t;
  t.q = TensorView(addr(0), DType::bf16, {2, 8, 100, 64}, {51200, 6400, 64, 2});
  EXPECT_EQ(error_of(t), "q: last dimension (Dqk) must be contiguous (stride 1), got stride 2");
  t = Views();
  t.o = TensorView(addr(3), DType::bf16, {2, 8, 100, 32}, {25600, -3200, 32, 1});
  EXPECT_EQ(error_of(t), "o: stride of Hq must be non-negative, got -3200");
  t = Views();
  t.lse = TensorView(addr(4), DType::f32, {2, 8, 100}, {800, 100, 2});
  EXPECT_EQ(error_of(t), "lse: last dimension (Lq) must be contiguous (stride 1), got stride 2");
}

TEST(ValidateAttention, Dtypes) {
  Views t;
  t.q.dtype = t.k.dtype = t.v.dtype = t.o.dtype = DType::f32;
  EXPECT_EQ(error_of(t), "q: dtype must be f16 or bf16, got f32");
  t = Views();
  t.v.dtype = DType::f16;
  EXPECT_EQ(error_of(t), "v: dtype must match q (bf16), got f16");
  t = Views();
  t.lse.dtype = DType::bf16;
  EXPECT_EQ(error_of(t), "lse: dtype must be f32, got bf16");
}

TEST(ValidateAttention, MatchingDimensions) {
  Views t;
  t.k = TensorView(addr(1), DType::bf16, {3, 2, 300, 64});
  EXPECT_EQ(error_of(t), "k: B must match q (2), got 3");
  t = Views();
  t.k = TensorView(addr(1), DType::bf16, {2, 2, 300, 128});
  EXPECT_EQ(error_of(t), "k: Dqk must match q (64), got 128");
  t = Views();
  t.v = TensorView(addr(2), DType::bf16, {2, 4, 300, 32});
  EXPECT_EQ(error_of(t), "v: Hkv must match k (2), got 4");
  t = Views();
  t.v = TensorView(addr(2), DType::bf16, {2, 2, 200, 32});
  EXPECT_EQ(error_of(t), "v: Lkv must match k (300), got 200");
  t = Views();
  t.o = TensorView(addr(3), DType::bf16, {2, 4, 100, 32});
  EXPECT_EQ(error_of(t), "o: Hq must match q (8), got 4");
  t = Views();
  t.o = TensorView(addr(3), DType::bf16, {2, 8, 99, 32});
  EXPECT_EQ(error_of(t), "o: Lq must match q (100), got 99");
  t = Views();
  t.o = TensorView(addr(3), DType::bf16, {2, 8, 100, 64});
  EXPECT_EQ(error_of(t), "o: Dv must match v (32), got 64");
  t = Views();
  t.lse = TensorView(addr(4), DType::f32, {2, 8, 101});
  EXPECT_EQ(error_of(t), "lse: Lq must match q (100), got 101");
}

TEST(ValidateAttention, GroupedHeads) {
  Views t;
  t.k = TensorView(addr(1), DType::bf16, {2, 3, 300, 64});
  t.v = TensorView(addr(2), DType::bf16, {2, 3, 300, 32});
  EXPECT_EQ(error_of(t), "q: Hq (8) must be a multiple of Hkv (3)");
}

TEST(ValidateAttention, Alignment) {
  Views t;
  t.k.data = static_cast<char*>(addr(1)) + 8;
  EXPECT_EQ(error_of(t), "k: data pointer must be 16-byte aligned");
  t = Views();
  t.q = TensorView(addr(0), DType::bf16, {2, 8, 100, 60});
  t.k = TensorView(addr(1), DType::bf16, {2, 2, 300, 60});
  EXPECT_EQ(error_of(t), "q: Dqk must be a multiple of 8 for 16-byte rows, got 60");
  t = Views();
  t.v = TensorView(addr(2), DType::bf16, {2, 2, 300, 36});
  t.o = TensorView(addr(3), DType::bf16, {2, 8, 100, 36});
  EXPECT_EQ(error_of(t), "v: Dv must be a multiple of 8 for 16-byte rows, got 36");
  t = Views();
  t.q = TensorView(addr(0), DType::bf16, {2, 8, 100, 64}, {51200, 6400, 68, 1});
  EXPECT_EQ(error_of(t), "q: stride of Lq must be a multiple of 8 elements (16 bytes), got 68");
  t = Views();
  // A size-1 dimension's stride is never used, so it need not be aligned.
  t.q = TensorView(addr(0), DType::bf16, {2, 1, 100, 64}, {6400, 3, 64, 1});
  t.o = TensorView(addr(3), DType::bf16, {2, 1, 100, 32});
  t.lse = TensorView(addr(4), DType::f32, {2, 1, 100});
  t.k = TensorView(addr(1), DType::bf16, {2, 1, 300, 64});
  t.v = TensorView(addr(2), DType::bf16, {2, 1, 300, 32});
  EXPECT_EQ(error_of(t), "");
  t = Views();
  t.lse.data = static_cast<char*>(addr(4)) + 2;
  EXPECT_EQ(error_of(t), "lse: data pointer must be 4-byte aligned");
}

TEST(FwdParams, FillsStridesSizesAndTables) {
  Views t;
  t.k = TensorView(addr(1), DType::bf16, {2, 2, 300, 64}, {76800, 64, 128, 1});  // [B, L, H, D]
  FaBlockTables tables{};
  tables.num_q_blocks = 1;
  tables.num_kv_blocks = 3;
  tables.q_block = tables.kv_block = 128;
  FaFwdParams p = fa::rt::make_fwd_params(t.q, t.k, t.v, t.o, &t.lse, 0.125f, tables);
  EXPECT_EQ(p.q, t.q.data);
  EXPECT_EQ(p.lse, t.lse.data);
  EXPECT_EQ(p.q_stride_b, 51200);
  EXPECT_EQ(p.q_stride_h, 6400);
  EXPECT_EQ(p.q_stride_m, 64);
  EXPECT_EQ(p.k_stride_b, 76800);
  EXPECT_EQ(p.k_stride_h, 64);
  EXPECT_EQ(p.k_stride_n, 128);
  EXPECT_EQ(p.v_stride_n, 32);
  EXPECT_EQ(p.o_stride_h, 3200);
  EXPECT_EQ(p.lse_stride_b, 800);
  EXPECT_EQ(p.lse_stride_h, 100);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.heads_q, 8);
  EXPECT_EQ(p.heads_kv, 2);
  EXPECT_EQ(p.len_q, 100);
  EXPECT_EQ(p.len_kv, 300);
  EXPECT_FLOAT_EQ(p.scale, 0.125f);
  EXPECT_EQ(p.mask.num_kv_blocks, 3);
  FaFwdParams no_lse = fa::rt::make_fwd_params(t.q, t.k, t.v, t.o, nullptr, 1.0f, tables);
  EXPECT_EQ(no_lse.lse, nullptr);
  EXPECT_EQ(no_lse.lse_stride_b, 0);
}

}  // namespace

// ---- TMA strides (runtime/tma.cpp): what the Hopper kernels' tensor maps take ----------------

TEST(TmaStrides, ContiguousStridedAndSizeOneViews) {
  void* p = reinterpret_cast<void*>(uintptr_t(0x10000));
  uint64_t b[3];
  // Contiguous [2, 4, 1000, 128] bf16: L, H, B strides in bytes.
  ASSERT_TRUE(fa::rt::tma_strides(fa::TensorView(p, fa::DType::bf16, {2, 4, 1000, 128}), b));
  EXPECT_EQ(b[0], 256u);
  EXPECT_EQ(b[1], 256000u);
  EXPECT_EQ(b[2], 1024000u);
  // [B, L, H, D] storage seen as [B, H, L, D] (H stride below L's): any order of strides.
  ASSERT_TRUE(fa::rt::tma_strides(
      fa::TensorView(p, fa::DType::f16, {2, 4, 1000, 80}, {1000 * 4 * 80, 80, 4 * 80, 1}), b));
  EXPECT_EQ(b[0], 640u);
  EXPECT_EQ(b[1], 160u);
  EXPECT_EQ(b[2], 640000u);
  // Size-1 dims are never stepped: packed strides whatever the view says.
  ASSERT_TRUE(fa::rt::tma_strides(fa::TensorView(p, fa::DType::bf16, {1, 1, 1000, 72}, {7, 3, 72, 1}), b));
  EXPECT_EQ(b[0], 144u);
  EXPECT_EQ(b[1], 144000u);
  EXPECT_EQ(b[2], 144000u);
}

TEST(TmaStrides, RefusesWhatTheDriverWouldNot) {
  void* p = reinterpret_cast<void*>(uintptr_t(0x10000));
  uint64_t b[3];
  // A broadcast batch (stride 0), a row stride of 100 elements (200 B), D not contiguous.
  EXPECT_FALSE(
      fa::rt::tma_strides(fa::TensorView(p, fa::DType::bf16, {2, 4, 1000, 128}, {0, 1000 * 128, 128, 1}), b));
  EXPECT_FALSE(fa::rt::tma_strides(
      fa::TensorView(p, fa::DType::bf16, {2, 4, 1000, 96}, {4 * 1000 * 100, 1000 * 100, 100, 1}), b));
  EXPECT_FALSE(fa::rt::tma_strides(
      fa::TensorView(p, fa::DType::bf16, {2, 4, 1000, 64}, {4 * 1000 * 128, 1000 * 128, 128, 2}), b));
}

// Paged pools: the kernels address a row with 32-bit byte offsets per stride (KvTiles), so a
// page or row stride of 2^31 bytes or more is refused by name. Host checks only (no
// check_tables): the fake addresses are never read.
TEST(RaggedViews, PagedPoolStridesUnder2To31Bytes) {
  const TensorView q(addr(0), DType::bf16, {300, 2, 128}), o(addr(3), DType::bf16, {300, 2, 128});
  const TensorView cq(addr(5), DType::i32, {3}), n(addr(6), DType::i32, {2}), pt(addr(7), DType::i32, {2, 4});
  fa::Sequences s;
  s.cu_seqlens_q = &cq, s.max_seqlen_q = 128;
  s.page_table = &pt, s.seqlens_k = &n, s.max_seqlen_k = 256;
  const TensorView k(addr(1), DType::bf16, {8, 64, 2, 128});
  auto error = [&](const TensorView& kk, const TensorView& vv) -> std::string {
    try {
      fa::ragged_views(q, kk, vv, o, nullptr, s);
    } catch (const fa::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error(k, k), "");
  const int64_t big = int64_t(1) << 30;  // elements: 2^31 bytes of bf16
  const TensorView wide_page(addr(2), DType::bf16, {8, 64, 2, 128}, {big, 256, 128, 1});
  const TensorView wide_row(addr(2), DType::bf16, {8, 64, 2, 128}, {64 * 256, big, 128, 1});
  const TensorView just_under(addr(2), DType::bf16, {8, 64, 2, 128}, {big - 8, 256, 128, 1});
  EXPECT_EQ(
      error(wide_page, k),
      "k: stride of num_pages is 1073741824 elements; a paged pool's page and row strides must each stay "
      "under 2^31 bytes");
  EXPECT_EQ(
      error(k, wide_row),
      "v: stride of page_size is 1073741824 elements; a paged pool's page and row strides must each stay "
      "under 2^31 bytes");
  EXPECT_EQ(error(just_under, just_under), "");
}

// The ragged backward's gradient views (fa::ragged_grad_views): packed like their primal, the
// totals matching, dlse like lse; paged and padded keys refused by name. Host checks only.
TEST(RaggedViews, BackwardGradientsMatchTheirPrimals) {
  const TensorView q(addr(0), DType::bf16, {300, 4, 128}), k(addr(1), DType::bf16, {500, 2, 128});
  const TensorView cq(addr(5), DType::i32, {3}), ck(addr(6), DType::i32, {3});
  fa::Sequences s;
  s.cu_seqlens_q = &cq, s.max_seqlen_q = 200;
  s.cu_seqlens_k = &ck, s.max_seqlen_k = 400;
  const TensorView dout(addr(2), DType::bf16, {300, 4, 64}), dq(addr(3), DType::bf16, {300, 4, 128}),
      dk(addr(4), DType::bf16, {500, 2, 128}), dv(addr(7), DType::bf16, {500, 2, 64}),
      dlse(addr(8), DType::f32, {4, 300});
  auto error = [&](const TensorView& a, const TensorView& b, const TensorView& c, const TensorView& d,
                   const TensorView* l, const fa::Sequences& seq) -> std::string {
    try {
      const fa::RaggedGradViews g = fa::ragged_grad_views(q, k, a, b, c, d, l, seq);
      // [B, H, max, D] with batch stride 0 over the packed rows
      EXPECT_EQ(g.dq.shape[0], 2);
      EXPECT_EQ(g.dq.shape[2], 200);
      EXPECT_EQ(g.dq.stride[0], 0);
      EXPECT_EQ(g.dk.shape[2], 400);
      if (l) {
        EXPECT_EQ(g.dlse.stride[2], 1);
      }
    } catch (const fa::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error(dout, dq, dk, dv, &dlse, s), "");
  EXPECT_EQ(error(dout, TensorView(addr(3), DType::bf16, {299, 4, 128}), dk, dv, nullptr, s),
            "dq: total_q must match q (300), got 299");
  EXPECT_EQ(error(TensorView(addr(2), DType::bf16, {301, 4, 64}), dq, dk, dv, nullptr, s),
            "dout: total_q must match q (300), got 301");
  EXPECT_EQ(error(dout, dq, dk, TensorView(addr(7), DType::bf16, {499, 2, 64}), nullptr, s),
            "dv: total_kv must match k (500), got 499");
  EXPECT_EQ(error(dout, dq, TensorView(addr(4), DType::bf16, {1, 500, 2, 128}), dv, nullptr, s),
            "dk: a packed tensor has 3 dimensions [total, H, D], got 4");
  const TensorView dlse_t(addr(8), DType::f32, {300, 4});
  EXPECT_EQ(error(dout, dq, dk, dv, &dlse_t, s), "dlse: expected [Hq, total_q] = [4, 300], got [300, 4]");
  fa::Sequences paged = s;
  const TensorView pt(addr(9), DType::i32, {2, 4}), n(addr(10), DType::i32, {2});
  paged.cu_seqlens_k = nullptr, paged.page_table = &pt, paged.seqlens_k = &n;
  EXPECT_EQ(error(dout, dq, dk, dv, nullptr, paged),
            "page_table: the backward takes packed (cu_seqlens_k) or dense keys, not a paged cache");
  fa::Sequences padded = s;
  padded.cu_seqlens_k = nullptr, padded.seqlens_k = &n;
  EXPECT_EQ(
      error(dout, dq, dk, dv, nullptr, padded),
      "seqlens_k: the backward takes packed (cu_seqlens_k) or dense keys, not a padded cache (every key "
      "of a dense k, v is a key of its sequence)");
}

// overlaps: a byte both views address, exactly (check_outputs_apart refuses outputs by it).
TEST(Overlaps, SpansAndDenseViews) {
  alignas(16) static char pool[4096];
  fa::TensorView a(pool, fa::DType::bf16, {4, 64}), b(pool + 512, fa::DType::bf16, {4, 64});
  EXPECT_FALSE(fa::overlaps(a, b));  // a: bytes 0..511, b: 512..1023
  fa::TensorView c(pool + 510, fa::DType::bf16, {1, 8});
  EXPECT_TRUE(fa::overlaps(a, c));
  EXPECT_TRUE(fa::overlaps(c, b));
  EXPECT_TRUE(fa::overlaps(a, a));
  EXPECT_FALSE(fa::overlaps(a, fa::TensorView()));
  // An f32 view inside a bf16 one, and one just past its end.
  EXPECT_TRUE(fa::overlaps(a, fa::TensorView(pool + 508, fa::DType::f32, {1})));
  EXPECT_FALSE(fa::overlaps(a, fa::TensorView(pool + 512, fa::DType::f32, {1})));
}

TEST(Overlaps, InterleavedViewsShareNoElement) {
  alignas(16) static char pool[1 << 16];
  // Rows 0 and 2 of a 4 x 64 block; row 1 lies between, not in; row 2 is in.
  fa::TensorView rows02(pool, fa::DType::bf16, {2, 64}, {128, 1});
  EXPECT_FALSE(fa::overlaps(rows02, fa::TensorView(pool + 128, fa::DType::bf16, {1, 64})));
  EXPECT_TRUE(fa::overlaps(rows02, fa::TensorView(pool + 256 + 126, fa::DType::bf16, {1, 2})));
  // q, k, v as heads of one packed [B 2, L 8, Hq 4 + 2 Hkv 2, D 16] buffer, as [B, H, L, D] views.
  constexpr int64_t B = 2, L = 8, Hq = 4, Hkv = 2, Ht = Hq + 2 * Hkv, D = 16;
  auto heads = [&](int64_t first, int64_t n) {
    return fa::TensorView(pool + first * D * 2, fa::DType::bf16, {B, n, L, D}, {L * Ht * D, D, Ht * D, 1});
  };
  const fa::TensorView q = heads(0, Hq), k = heads(Hq, Hkv), v = heads(Hq + Hkv, Hkv);
  EXPECT_FALSE(fa::overlaps(q, k));
  EXPECT_FALSE(fa::overlaps(k, v));
  EXPECT_FALSE(fa::overlaps(q, v));
  EXPECT_TRUE(fa::overlaps(q, heads(Hq - 1, Hkv)));  // one head too early
  EXPECT_TRUE(fa::overlaps(k, heads(0, Ht)));        // the whole buffer
  // k as a [B, L, H, D] view of the same heads, and f32 values inside the buffer.
  const fa::TensorView k_blhd(pool + Hq * D * 2, fa::DType::bf16, {B, L, Hkv, D}, {L * Ht * D, Ht * D, D, 1});
  EXPECT_FALSE(fa::overlaps(q, k_blhd));
  EXPECT_TRUE(fa::overlaps(k, k_blhd));
  EXPECT_TRUE(fa::overlaps(v, fa::TensorView(pool + (L * Ht * D + (Hq + Hkv) * D) * 2, fa::DType::f32, {4})));
  EXPECT_FALSE(fa::overlaps(v, fa::TensorView(pool + (L * Ht * D + Hq * D) * 2, fa::DType::f32, {4})));
}

// check_outputs_apart refuses an output whose own elements share memory (a stride of 0, rows
// closer than a row) and takes the usual layouts, transposed and strided ones included.
TEST(Overlaps, AnOutputOverlappingItselfIsRefused) {
  alignas(16) static char pool[1 << 16];
  auto error_of = [&](const fa::TensorView& o) {
    try {
      fa::check_outputs_apart({{"o", &o}}, {});
    } catch (const fa::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of(fa::TensorView(pool, fa::DType::bf16, {1, 2, 16, 64}, {0, 1024, 0, 1})),
            "o: its elements overlap one another (shape [1, 2, 16, 64], strides [0, 1024, 0, 1]); give it a "
            "layout in which every element has memory of its own");
  EXPECT_NE(error_of(fa::TensorView(pool, fa::DType::bf16, {1, 2, 16, 64}, {2048, 1024, 32, 1})), "");
  EXPECT_EQ(error_of(fa::TensorView(pool, fa::DType::bf16, {1, 2, 16, 64})), "");
  EXPECT_EQ(error_of(fa::TensorView(pool, fa::DType::bf16, {2, 4, 16, 64}, {4096, 64, 256, 1})), "");  // BLHD
  EXPECT_EQ(error_of(fa::TensorView(pool, fa::DType::bf16, {1, 2, 16, 64}, {9999, 2048, 128, 1})),
            "");  // padded
  EXPECT_EQ(error_of(fa::TensorView(pool, fa::DType::f32, {3, 1, 16}, {16, 0, 1})),
            "");  // size-1 dim, stride 0
}

// overlaps against brute force on random small views of one pool: shapes 1-4 per dimension,
// strides -9..9 elements (0 included), offsets, bf16 or f32; every element's bytes enumerated.
TEST(Overlaps, AgreesWithBruteForce) {
  alignas(16) static char pool[1 << 14];
  std::mt19937 rng(11);
  auto random_view = [&]() {
    const int rank = 1 + int(rng() % 4);
    const fa::DType dt = rng() % 2 ? fa::DType::bf16 : fa::DType::f32;
    fa::TensorView v;
    v.dtype = dt;
    v.rank = rank;
    int64_t lo = 0;
    for (int d = 0; d < rank; ++d) {
      v.shape[d] = 1 + int64_t(rng() % 4);
      v.stride[d] = int64_t(rng() % 19) - 9;
      if (v.stride[d] < 0) lo += (v.shape[d] - 1) * v.stride[d];
    }
    const int64_t esize = int64_t(fa::dtype_size(dt));
    v.data = pool + 4096 + (-lo + int64_t(rng() % 64)) * esize;
    return v;
  };
  auto bytes = [](const fa::TensorView& v) {
    std::set<intptr_t> out;
    const int64_t esize = int64_t(fa::dtype_size(v.dtype));
    int64_t idx[4] = {0, 0, 0, 0};
    for (int64_t n = 0; n < v.numel(); ++n) {
      int64_t off = 0, rest = n;
      for (int d = v.rank - 1; d >= 0; --d)
        idx[d] = rest % v.shape[d], rest /= v.shape[d], off += idx[d] * v.stride[d];
      for (int64_t b = 0; b < esize; ++b) out.insert(reinterpret_cast<intptr_t>(v.data) + off * esize + b);
    }
    return out;
  };
  int shared = 0;
  for (int i = 0; i < 3000; ++i) {
    const fa::TensorView a = random_view(), b = random_view();
    const std::set<intptr_t> x = bytes(a), y = bytes(b);
    bool meet = false;
    for (intptr_t p : x) meet = meet || y.count(p);
    shared += meet;
    ASSERT_EQ(fa::overlaps(a, b), meet)
        << "case " << i << ": " << a.to_string() << " at " << (static_cast<char*>(a.data) - pool) << " vs "
        << b.to_string() << " at " << (static_cast<char*>(b.data) - pool);
  }
  EXPECT_GT(shared, 300);  // both answers well represented
  EXPECT_LT(shared, 2700);
}
