// Ragged (packed, variable-length) batches and paged KV caches on the GPU (fa::Sequences):
// each sequence's output and LSE against the float64 reference of that sequence alone (its
// mods seeing positions from 0 and its own b), on fresh random inputs with O and LSE poisoned;
// the same K/V scattered over shuffled pages of a pool gives bit-identical results; lengths
// 0 and 1 included; the short-query cases take the decoding kernel, the others the prefill
// (on Hopper the wgmma forward with K/V by cp.async at every head dim, and mma.sync where a case
// asks for it).
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "fajit/runtime/device.h"
#include "gpu_harness.h"

namespace fa_gpu_test {
namespace {

struct SeqCase {
  std::string variant;
  fa::DType dtype;
  int dqk, dv, Hq, Hkv;
  std::vector<int> lens_q, lens_kv;
  int page_size;
  bool dense_q = false;  // q, o [B, Hq, Lq, D] (all lens_q equal) instead of packed
  int param = -1;        // the variant's knob (window, ...)
  fa::KernelFamily family = fa::KernelFamily::kAuto;  // the prefill's: wgmma on sm_90a
  bool max_scores = false;  // ForwardOptions::max_scores too ([Hq, total_q] like the LSE), checked
  std::string name() const {
    std::string n = fmt::format("{}_{}_d{}x{}_h{}g{}_p{}", variant, fa::dtype_name(dtype), dqk, dv, Hq,
                                Hq / Hkv, page_size);
    for (size_t b = 0; b < lens_q.size(); ++b) n += fmt::format("_{}x{}", lens_q[b], lens_kv[b]);
    return n + (dense_q ? "_denseq" : "") +
           (family == fa::KernelFamily::kMmaSync ? "_mma"
            : family == fa::KernelFamily::kWgmma ? "_wgmma"
                                                 : "") +
           (max_scores ? "_max" : "");
  }
};

// c with max_scores asked for too (and the prefill's family, where given)
SeqCase with_max(SeqCase c, fa::KernelFamily family = fa::KernelFamily::kAuto) {
  c.max_scores = true;
  c.family = family;
  return c;
}

std::vector<SeqCase> cases() {
  const fa::DType bf16 = fa::DType::bf16, f16 = fa::DType::f16;
  std::vector<SeqCase> all = {
      // prefill: empty and one-token sequences, lengths off the tile, GQA 4
      {"causal", bf16, 128, 128, 8, 2, {0, 1, 300, 17, 1000}, {0, 1, 300, 17, 1000}, 16},
      {"sliding", f16, 64, 64, 4, 4, {129, 5, 0, 700}, {129, 900, 3, 700}, 64, false, 64},
      {"document2d_causal", bf16, 64, 64, 2, 1, {200, 77, 333}, {250, 77, 333}, 32},  // mods read b
      {"alibi_slopes", f16, 80, 80, 4, 2, {70, 1, 260}, {90, 2, 260}, 1},             // page size 1
      // the wgmma prefill's other tiles (Hopper): BLOCK_N 64 at d256, QK != V, softcap at d96
      // (128x128 with a score_mod and a mask_mod), a page smaller than a row step
      {"causal", f16, 256, 256, 4, 4, {300, 0, 129}, {300, 5, 200}, 16},
      {"none", bf16, 192, 128, 8, 2, {257, 64}, {1100, 66}, 8},
      {"document_softcap", bf16, 96, 96, 4, 1, {500, 193}, {520, 193}, 3, false, 60},
      // decoding (max_q <= 64): one token over long caches (vLLM), a few tokens, GQA 8
      {"none", bf16, 128, 128, 32, 4, {1, 1, 1, 1}, {1, 8191, 0, 33000}, 16, true},
      {"sliding", f16, 128, 128, 8, 1, {16, 3, 0, 9}, {5000, 17, 12, 131072}, 128, false, 256},
      {"document_softcap", bf16, 96, 96, 8, 8, {2, 64, 1}, {4097, 64, 1000}, 48},
      {"causal", bf16, 192, 128, 4, 2, {64, 7}, {3000, 7}, 16},
      // an interval mask at int32's ends: paged prefill, decoding with GQA 4
      {"kv_range_extremes", bf16, 64, 64, 12, 3, {200, 1, 33}, {700, 5000, 33}, 16},
      {"kv_range_extremes", f16, 128, 128, 12, 3, {4, 1, 16}, {3000, 9000, 17}, 32},
      // a kv-linear score_mod whose rate reads q and b: paged prefill and decoding with GQA 4
      // (the decoder's rows span the group's heads)
      {"query_slope", bf16, 64, 64, 8, 2, {200, 1, 33}, {700, 5000, 33}, 16},
      {"query_slope", f16, 128, 128, 8, 2, {4, 1, 16}, {3000, 9000, 17}, 32},
      // decoding at d64 and d32, where the paged kernel needs more registers than the packed
      // one: both must still split alike (fuzz 848/41 found them 2 vs 3 CTAs per SM apart)
      {"none", bf16, 64, 64, 4, 4, {38, 39}, {402, 2438}, 128},
      {"causal", f16, 32, 32, 8, 2, {1, 5, 64}, {3000, 700, 64}, 16},
      // pages that split a thread's run of rows (KvTiles: one page-table load per run only
      // where the page size is a multiple of it, 8 rows at d128 decoding, 4 at d64 prefill)
      {"none", bf16, 128, 128, 8, 4, {1, 16, 2}, {3001, 500, 77}, 12},
      {"none", f16, 64, 64, 4, 2, {300, 129}, {1000, 700}, 6},
      // values by key gathered across the warp (key_keep_bias: [B, max_kv] buffers read at each
      // sequence's own positions) by the decoder up to d64: empty, one-token and 16-token
      // queries, GQA 2; and by the mma.sync prefill (below)
      {"key_keep_bias", f16, 64, 64, 4, 2, {1, 16, 0, 5}, {3000, 700, 12, 64}, 16},
      {"key_keep_bias", bf16, 64, 64, 4, 4, {300, 0, 129}, {300, 5, 200}, 16},
      // each row's largest score (the row-max twins), packed and paged, prefill and decoding,
      // empty sequences and sequences without keys (-inf)
      with_max({"causal", bf16, 128, 128, 8, 2, {0, 1, 300, 17, 1000}, {0, 1, 300, 17, 1000}, 16}),
      with_max({"document_softcap", bf16, 96, 96, 4, 1, {500, 193}, {520, 193}, 3, false, 60},
               fa::KernelFamily::kMmaSync),
      with_max({"none", bf16, 128, 128, 32, 4, {1, 1, 1, 1}, {1, 8191, 0, 33000}, 16, true}),
      with_max({"key_keep_bias", f16, 64, 64, 4, 2, {1, 16, 0, 5}, {3000, 700, 12, 64}, 16}),
      // padded rows gathered through the page table (load_rows_sw128): QK's odd chunk zero-filled
      // (D 72) beside V's partial third block (D 136: pitch 192, 8 threads a row), and the 192x112
      // tile that the sequence layouts' prefill takes at d96 without mods, pages not a power of 2
      {"causal", bf16, 72, 136, 4, 2, {300, 1, 129}, {333, 7, 700}, 3},
      {"none", f16, 96, 96, 4, 4, {700, 17, 2}, {900, 17, 64}, 5},
  };
  // the first two prefill cases on mma.sync too (the Hopper default is wgmma at every head dim:
  // its paged copy gathers padded rows and rows of pitch 192 too), and d80 and 192/128 there
  // (and the mods' values gathered on mma.sync: document2d by (b, q) and (b, kv), key_keep_bias)
  for (auto [i, family] : {std::pair{0, fa::KernelFamily::kMmaSync},
                           {1, fa::KernelFamily::kMmaSync},
                           {2, fa::KernelFamily::kMmaSync},
                           {16, fa::KernelFamily::kMmaSync},
                           {3, fa::KernelFamily::kMmaSync},
                           {5, fa::KernelFamily::kMmaSync}}) {
    SeqCase c = all[size_t(i)];
    c.family = family;
    all.push_back(c);
  }
  return all;
}

void PrintTo(const SeqCase& c, std::ostream* os) { *os << c.name(); }  // readable ctest names

class SequencesTest : public ::testing::TestWithParam<SeqCase> {};

// Random 16-bit values and their exact doubles.
struct Tensor16 {
  std::vector<uint16_t> bits;
  std::vector<float> vals;  // exact: 16-bit values are floats
  Tensor16(size_t n, fa::DType t, std::mt19937& rng) : bits(n), vals(n) {
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (size_t i = 0; i < n; ++i) bits[i] = to_bits(t, u(rng)), vals[i] = from_bits(t, bits[i]);
  }
};

fa::rt::DeviceBuffer upload(const void* host, size_t bytes) {
  fa::rt::DeviceBuffer d(std::max<size_t>(bytes, 16));
  if (bytes) d.upload(host, bytes);
  return d;
}

TEST_P(SequencesTest, MatchesReferenceAndPagesAreExact) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const SeqCase& c = GetParam();
  if (c.family == fa::KernelFamily::kWgmma && fa::rt::current_device_info().cc_major != 9)
    GTEST_SKIP() << "the wgmma kernel runs on compute capability 9.0 only";
  const Variant& var = variant(c.variant);
  const int B = static_cast<int>(c.lens_q.size());
  const int max_q = std::max(1, *std::max_element(c.lens_q.begin(), c.lens_q.end()));
  const int max_kv = std::max(1, *std::max_element(c.lens_kv.begin(), c.lens_kv.end()));
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE(fmt::format("seed {}", seed));
  fa::rt::ContextGuard guard;

  fa::Options opts;
  opts.dtype = c.dtype, opts.head_dim_qk = c.dqk, opts.head_dim_v = c.dv, opts.family = c.family;
  const fa::Kernel kernel = fa::compile(var.score(), var.mask(), opts);
  CaptureSet caps;
  var.fill(caps, Dims{B, c.Hq, max_q, max_kv}, c.param, rng);
  caps.upload();
  const fa::Captures cap = caps.captures();
  const fa::BlockMask mask = kernel.block_mask(B, c.Hq, max_q, max_kv, cap);

  // Packed rows: sequence b's queries from cu_q[b], keys from cu_k[b].
  std::vector<int32_t> cu_q(B + 1, 0), cu_k(B + 1, 0);
  for (int b = 0; b < B; ++b) cu_q[b + 1] = cu_q[b] + c.lens_q[b], cu_k[b + 1] = cu_k[b] + c.lens_kv[b];
  const int64_t total_q = c.dense_q ? int64_t(B) * max_q : cu_q[B], total_kv = cu_k[B];
  auto q_row = [&](int b, int i) { return c.dense_q ? int64_t(b) * max_q + i : int64_t(cu_q[b]) + i; };
  // q/o rows are [row, H, D] packed; dense q is [B, H, Lq, D]: row (b, i) of head h at
  // ((b * H + h) * Lq + i) * D.
  auto q_at = [&](int b, int h, int i, int D) {
    return c.dense_q ? ((int64_t(b) * c.Hq + h) * max_q + i) * D : (q_row(b, i) * c.Hq + h) * D;
  };
  Tensor16 q(size_t(std::max<int64_t>(total_q, 1)) * c.Hq * c.dqk, c.dtype, rng);
  Tensor16 k(size_t(std::max<int64_t>(total_kv, 1)) * c.Hkv * c.dqk, c.dtype, rng);
  Tensor16 v(size_t(std::max<int64_t>(total_kv, 1)) * c.Hkv * c.dv, c.dtype, rng);

  // The paged pool: every sequence's keys in pages of page_size, pages shuffled over the pool
  // (plus a few never used), the page table padded with -1 past each sequence's pages.
  const int ps = c.page_size;
  const int max_pages = (max_kv + ps - 1) / ps;
  std::vector<int> first_page(B + 1, 0);
  for (int b = 0; b < B; ++b) first_page[b + 1] = first_page[b] + (c.lens_kv[b] + ps - 1) / ps;
  const int num_pages = first_page[B] + 3;
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(size_t(B) * max_pages, -1);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < first_page[b + 1] - first_page[b]; ++j)
      table[size_t(b) * max_pages + j] = perm[first_page[b] + j];
  auto pool_of = [&](const Tensor16& t, int D) {
    std::vector<uint16_t> pool(size_t(num_pages) * ps * c.Hkv * D);
    for (uint16_t& x : pool) x = to_bits(c.dtype, 1e4f);  // unused slots: loud if ever read
    for (int b = 0; b < B; ++b)
      for (int kv = 0; kv < c.lens_kv[b]; ++kv) {
        const int64_t dst = (int64_t(table[size_t(b) * max_pages + kv / ps]) * ps + kv % ps) * c.Hkv * D;
        std::memcpy(&pool[size_t(dst)], &t.bits[size_t(int64_t(cu_k[b] + kv) * c.Hkv * D)],
                    size_t(c.Hkv) * D * 2);
      }
    return pool;
  };
  const std::vector<uint16_t> k_pool = pool_of(k, c.dqk), v_pool = pool_of(v, c.dv);

  fa::rt::DeviceBuffer dq = upload(q.bits.data(), q.bits.size() * 2),
                       dk = upload(k.bits.data(), k.bits.size() * 2),
                       dv = upload(v.bits.data(), v.bits.size() * 2),
                       dkp = upload(k_pool.data(), k_pool.size() * 2),
                       dvp = upload(v_pool.data(), v_pool.size() * 2),
                       dcu_q = upload(cu_q.data(), cu_q.size() * 4),
                       dcu_k = upload(cu_k.data(), cu_k.size() * 4),
                       dtable = upload(table.data(), table.size() * 4),
                       dlens_k = upload(c.lens_kv.data(), c.lens_kv.size() * 4);
  const size_t o_elems = size_t(std::max<int64_t>(total_q, 1)) * c.Hq * c.dv,
               lse_elems = size_t(c.Hq) * std::max<int64_t>(total_q, 1);
  fa::rt::DeviceBuffer o_packed(o_elems * 2), o_paged(o_elems * 2), lse_packed(lse_elems * 4),
      lse_paged(lse_elems * 4), max_packed(lse_elems * 4), max_paged(lse_elems * 4);

  const int64_t tq = std::max<int64_t>(total_q, 1), tk = std::max<int64_t>(total_kv, 1);
  fa::TensorView cuq_v(dcu_q.as<void>(), fa::DType::i32, {B + 1}),
      cuk_v(dcu_k.as<void>(), fa::DType::i32, {B + 1}), lens_v(dlens_k.as<void>(), fa::DType::i32, {B}),
      table_v(dtable.as<void>(), fa::DType::i32, {B, max_pages});
  auto q_view = [&]() {
    return c.dense_q ? fa::TensorView(dq.as<void>(), c.dtype, {B, c.Hq, max_q, c.dqk})
                     : fa::TensorView(dq.as<void>(), c.dtype, {tq, c.Hq, c.dqk});
  };
  auto o_view = [&](fa::rt::DeviceBuffer& o) {
    return c.dense_q ? fa::TensorView(o.as<void>(), c.dtype, {B, c.Hq, max_q, c.dv})
                     : fa::TensorView(o.as<void>(), c.dtype, {tq, c.Hq, c.dv});
  };
  auto lse_view = [&](fa::rt::DeviceBuffer& l) {
    return c.dense_q ? fa::TensorView(l.as<void>(), fa::DType::f32, {B, c.Hq, max_q})
                     : fa::TensorView(l.as<void>(), fa::DType::f32, {c.Hq, tq});
  };

  // packed K/V (cu_seqlens_k); dense q takes packed keys too when lengths differ
  auto run = [&](bool paged, fa::rt::DeviceBuffer& o, fa::rt::DeviceBuffer& lse, fa::rt::DeviceBuffer& mx) {
    o.memset8(0xFF);
    lse.memset8(0xFF);
    mx.memset8(0xFF);
    fa::TensorView lv = lse_view(lse), mv = lse_view(mx);
    fa::ForwardOptions fo;
    fo.lse = &lv;
    if (c.max_scores) fo.max_scores = &mv;
    fo.sequences.check_tables = true;
    if (!c.dense_q) fo.sequences.cu_seqlens_q = &cuq_v, fo.sequences.max_seqlen_q = max_q;
    fo.sequences.max_seqlen_k = max_kv;
    if (paged) {
      fo.sequences.page_table = &table_v, fo.sequences.seqlens_k = &lens_v;
      kernel.forward(q_view(), fa::TensorView(dkp.as<void>(), c.dtype, {num_pages, ps, c.Hkv, c.dqk}),
                     fa::TensorView(dvp.as<void>(), c.dtype, {num_pages, ps, c.Hkv, c.dv}), o_view(o), mask,
                     cap, fo);
    } else {
      fo.sequences.cu_seqlens_k = &cuk_v;
      kernel.forward(q_view(), fa::TensorView(dk.as<void>(), c.dtype, {tk, c.Hkv, c.dqk}),
                     fa::TensorView(dv.as<void>(), c.dtype, {tk, c.Hkv, c.dv}), o_view(o), mask, cap, fo);
    }
    fa::rt::synchronize(nullptr);
  };
  run(false, o_packed, lse_packed, max_packed);
  run(true, o_paged, lse_paged, max_paged);

  std::vector<uint16_t> out(o_elems), out_paged(o_elems);
  std::vector<float> lse(lse_elems), lse_p(lse_elems), mx(lse_elems), mx_p(lse_elems);
  max_packed.download(mx.data(), lse_elems * 4);
  max_paged.download(mx_p.data(), lse_elems * 4);
  if (c.max_scores) {
    EXPECT_EQ(std::memcmp(mx.data(), mx_p.data(), lse_elems * 4), 0) << "paged max_scores differ from packed";
  }
  o_packed.download(out.data(), o_elems * 2);
  o_paged.download(out_paged.data(), o_elems * 2);
  lse_packed.download(lse.data(), lse_elems * 4);
  lse_paged.download(lse_p.data(), lse_elems * 4);
  // Paged = packed, bit for bit (same kernel arithmetic, only the addresses differ).
  EXPECT_EQ(std::memcmp(out.data(), out_paged.data(), o_elems * 2), 0) << "paged output differs from packed";
  EXPECT_EQ(std::memcmp(lse.data(), lse_p.data(), lse_elems * 4), 0) << "paged LSE differs from packed";

  // Each sequence against the float64 reference of that sequence alone (mods that read b see
  // it: the reference runs b + 1 batches over the same rows and keeps the last).
  ModPrograms progs = mod_programs(kernel.program());
  fa::Bindings env = caps.bindings();
  double num = 0, den = 0, lse_err = 0, max_err = 0;
  size_t bad = 0, rows = 0;
  for (int b = 0; b < B; ++b) {
    const int lq = c.lens_q[b], lkv = c.lens_kv[b];
    if (lq == 0) continue;
    rows += size_t(lq) * c.Hq;
    auto lse_at = [&](int h, int i) {
      return c.dense_q ? (size_t(b) * c.Hq + h) * max_q + i : size_t(h) * tq + size_t(q_row(b, i));
    };
    if (lkv == 0) {  // no key: O = 0, LSE = -inf
      for (int h = 0; h < c.Hq; ++h)
        for (int i = 0; i < lq; ++i) {
          for (int d = 0; d < c.dv; ++d)
            bad += from_bits(c.dtype, out[size_t(q_at(b, h, i, c.dv) + d)]) != 0.0;
          bad += !(std::isinf(lse[lse_at(h, i)]) && lse[lse_at(h, i)] < 0);
          if (c.max_scores) bad += !(std::isinf(mx[lse_at(h, i)]) && mx[lse_at(h, i)] < 0);
        }
      continue;
    }
    const int rb = var.mask_batch ? b + 1 : 1;
    fa::ReferenceOptions ro;
    ro.score_mod = &progs.score, ro.mask_mod = &progs.mask, ro.bindings = &env;
    const int64_t qs_h = c.dense_q ? int64_t(max_q) * c.dqk : c.dqk,
                  qs_m = c.dense_q ? c.dqk : int64_t(c.Hq) * c.dqk;
    ro.q_strides = std::array<int64_t, 4>{0, qs_h, qs_m, 1};
    ro.k_strides = std::array<int64_t, 4>{0, c.dqk, int64_t(c.Hkv) * c.dqk, 1};
    ro.v_strides = std::array<int64_t, 4>{0, c.dv, int64_t(c.Hkv) * c.dv, 1};
    const fa::ReferenceResult ref =
        fa::reference_attention({rb, c.Hq, c.Hkv, lq, lkv, c.dqk, c.dv}, q.vals.data() + q_at(b, 0, 0, c.dqk),
                                k.vals.data() + int64_t(cu_k[b]) * c.Hkv * c.dqk,
                                v.vals.data() + int64_t(cu_k[b]) * c.Hkv * c.dv, ro);
    const size_t last = size_t(rb - 1) * c.Hq;
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < lq; ++i) {
        const size_t r = (last + h) * lq + i;
        for (int d = 0; d < c.dv; ++d) {
          const double g = from_bits(c.dtype, out[size_t(q_at(b, h, i, c.dv) + d)]),
                       want = ref.out[r * c.dv + d];
          bad += std::isnan(g);
          num += (g - want) * (g - want), den += want * want;
        }
        const float l = lse[lse_at(h, i)];
        if (std::isinf(ref.lse[r]))
          bad += !(std::isinf(l) && l < 0);
        else
          lse_err = std::max(lse_err, std::abs(double(l) - ref.lse[r]));
        if (!c.max_scores) continue;
        const double m = mx[lse_at(h, i)], want = ref.max_score[r];
        if (std::isnan(want)) {
          bad += !std::isnan(m);
        } else if (std::isinf(want)) {
          bad += m != want;
        } else {  // as tests/gpu/forward_test.cpp bounds it
          const double e = std::isnan(m) ? INFINITY : std::abs(m - want);
          max_err = std::max(max_err, e);
          bad += !(e < 5e-4 + std::abs(want) * 0x1p-18);
        }
      }
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const double tol = c.dtype == fa::DType::bf16 ? 1e-2 : 5e-3;
  std::printf(
      "[ stats    ] rel %.2e  max |lse err| %.2e  max |max_scores err| %.2e  bad %zu  rows %zu  (seed %u)\n",
      rel, lse_err, max_err, bad, rows, seed);
  EXPECT_EQ(bad, 0u);
  EXPECT_LT(rel, tol);
  EXPECT_LT(lse_err, 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SequencesTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<SeqCase>& i) { return i.param.name(); });

// ---- the ragged backward (packed training batches) ------------------------------------------
// After the ragged forward, each sequence's dQ, dK, dV against the float64 reference backward of
// that sequence alone (its mods seeing its own b and positions from 0; Δ from the kernel's O),
// and the buffer gradients summed over the sequences; gradients poisoned first. A sequence
// without keys gets dQ = 0, one without queries dK = dV = 0, rows the mask empties and keys no
// query sees exactly 0; deterministic mode gives the same bits twice.
struct RaggedBwdCase {
  std::string variant;
  fa::DType dtype;
  int dqk, dv, Hq, Hkv;
  std::vector<int> lens_q, lens_kv;
  int param = -1;
  fa::KernelFamily family = fa::KernelFamily::kAuto;  // wgmma on sm_90a
  bool deterministic = false;
  bool dlse = false;
  std::string name() const {
    std::string n = fmt::format("{}_{}_d{}x{}_h{}g{}", variant, fa::dtype_name(dtype), dqk, dv, Hq, Hq / Hkv);
    for (size_t b = 0; b < lens_q.size(); ++b) n += fmt::format("_{}x{}", lens_q[b], lens_kv[b]);
    return n + (deterministic ? "_det" : "") + (dlse ? "_dlse" : "") +
           (family == fa::KernelFamily::kMmaSync ? "_mma" : "");
  }
};
void PrintTo(const RaggedBwdCase& c, std::ostream* os) { *os << c.name(); }

std::vector<RaggedBwdCase> ragged_bwd_cases() {
  const fa::DType bf16 = fa::DType::bf16, f16 = fa::DType::f16;
  const fa::KernelFamily mma = fa::KernelFamily::kMmaSync, autof = fa::KernelFamily::kAuto;
  return {
      // empty and one-token sequences, lengths off the tile, GQA 4 (Hopper: BLOCK_M 64, 3 stages)
      {"causal", bf16, 128, 128, 8, 2, {0, 1, 300, 17, 1000}, {0, 1, 300, 17, 1000}},
      // Lq != Lkv per sequence, a sequence with keys and no query (dK = dV = 0)
      {"sliding", f16, 64, 64, 4, 4, {129, 5, 0, 700}, {129, 900, 3, 700}, 64},
      {"document2d_causal", bf16, 64, 64, 2, 1, {200, 77, 333}, {250, 77, 333}},  // the mask reads b
      {"alibi_slopes", f16, 80, 80, 4, 2, {70, 1, 260}, {90, 2, 260}},            // slopes' gradient
      {"slope_extremes", bf16, 64, 64, 4, 2, {300, 1, 129}, {300, 64, 700}, 1},   // kv-linear, all rates
      {"kv_range_extremes", f16, 64, 64, 12, 4, {300, 1, 129}, {300, 64, 700}},   // interval mask
      {"relative_bias", bf16, 192, 128, 4, 2, {257, 64}, {300, 66}},  // the wide-head kernel, bias gradient
      {"document_softcap", bf16, 64, 64, 4, 1, {500, 193}, {520, 193}, 60, autof, true},
      // a sequence with queries and no key (dQ = 0), dLSE, the mma.sync kernels
      {"causal", bf16, 128, 128, 4, 1, {1000, 3, 64}, {1000, 0, 64}, -1, mma, false, true},
      {"none", f16, 64, 64, 4, 4, {300, 129}, {1000, 700}, -1, mma, true},
      {"causal", f16, 256, 256, 4, 4, {300, 0, 129}, {300, 5, 200}},
  };
}

class RaggedBackwardTest : public ::testing::TestWithParam<RaggedBwdCase> {};

TEST_P(RaggedBackwardTest, MatchesReferencePerSequence) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const RaggedBwdCase& c = GetParam();
  const Variant& var = variant(c.variant);
  const int B = static_cast<int>(c.lens_q.size());
  const int max_q = std::max(1, *std::max_element(c.lens_q.begin(), c.lens_q.end()));
  const int max_kv = std::max(1, *std::max_element(c.lens_kv.begin(), c.lens_kv.end()));
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE(fmt::format("seed {}", seed));
  fa::rt::ContextGuard guard;

  fa::Options opts;
  opts.dtype = c.dtype, opts.head_dim_qk = c.dqk, opts.head_dim_v = c.dv, opts.family = c.family;
  const fa::Kernel kernel = fa::compile(var.score(), var.mask(), opts);
  CaptureSet caps;
  var.fill(caps, Dims{B, c.Hq, max_q, max_kv}, c.param, rng);
  caps.upload();
  const fa::Captures cap = caps.captures();
  const fa::BlockMask mask = kernel.block_mask(B, c.Hq, max_q, max_kv, cap);

  std::vector<int32_t> cu_q(B + 1, 0), cu_k(B + 1, 0);
  for (int b = 0; b < B; ++b) cu_q[b + 1] = cu_q[b] + c.lens_q[b], cu_k[b + 1] = cu_k[b] + c.lens_kv[b];
  const int64_t tq = std::max(cu_q[B], 1), tk = std::max(cu_k[B], 1);
  Tensor16 q(size_t(tq) * c.Hq * c.dqk, c.dtype, rng), k(size_t(tk) * c.Hkv * c.dqk, c.dtype, rng),
      v(size_t(tk) * c.Hkv * c.dv, c.dtype, rng), dout(size_t(tq) * c.Hq * c.dv, c.dtype, rng);
  std::vector<float> dlse(size_t(c.Hq) * tq, 0.f);  // [Hq, total_q]
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  if (c.dlse)
    for (float& x : dlse) x = ud(rng);

  fa::rt::DeviceBuffer d_q = upload(q.bits.data(), q.bits.size() * 2),
                       d_k = upload(k.bits.data(), k.bits.size() * 2),
                       d_v = upload(v.bits.data(), v.bits.size() * 2),
                       d_do = upload(dout.bits.data(), dout.bits.size() * 2),
                       d_dlse = upload(dlse.data(), dlse.size() * 4),
                       d_cuq = upload(cu_q.data(), cu_q.size() * 4),
                       d_cuk = upload(cu_k.data(), cu_k.size() * 4);
  fa::rt::DeviceBuffer d_o(dout.bits.size() * 2), d_lse(dlse.size() * 4), d_dq(q.bits.size() * 2),
      d_dk(k.bits.size() * 2), d_dv(v.bits.size() * 2);
  auto packed = [&](fa::rt::DeviceBuffer& buf, int64_t rows, int H, int D) {
    return fa::TensorView(buf.as<void>(), c.dtype, {rows, H, D});
  };
  const fa::TensorView qv = packed(d_q, tq, c.Hq, c.dqk), kv = packed(d_k, tk, c.Hkv, c.dqk),
                       vv = packed(d_v, tk, c.Hkv, c.dv), ov = packed(d_o, tq, c.Hq, c.dv),
                       dov = packed(d_do, tq, c.Hq, c.dv), dqv = packed(d_dq, tq, c.Hq, c.dqk),
                       dkv = packed(d_dk, tk, c.Hkv, c.dqk), dvv = packed(d_dv, tk, c.Hkv, c.dv);
  const fa::TensorView lsev(d_lse.as<void>(), fa::DType::f32, {c.Hq, tq}),
      dlsev(d_dlse.as<void>(), fa::DType::f32, {c.Hq, tq}), cuq_v(d_cuq.as<void>(), fa::DType::i32, {B + 1}),
      cuk_v(d_cuk.as<void>(), fa::DType::i32, {B + 1});
  fa::Sequences seqs;
  seqs.cu_seqlens_q = &cuq_v, seqs.max_seqlen_q = max_q;
  seqs.cu_seqlens_k = &cuk_v, seqs.max_seqlen_k = max_kv;
  seqs.check_tables = true;

  fa::ForwardOptions fo;
  fo.lse = &lsev, fo.sequences = seqs;
  kernel.forward(qv, kv, vv, ov, mask, cap, fo);
  std::map<std::string, fa::rt::DeviceBuffer> d_bgrad;
  fa::BackwardOptions bo;
  for (const std::string& name : fa::detail::gradient_buffers(kernel.program())) {
    const fa::TensorView& primal = cap.buffers().at(name);
    fa::rt::DeviceBuffer& buf = d_bgrad[name];
    buf = fa::rt::DeviceBuffer(size_t(primal.numel()) * 4);
    std::vector<int64_t> shape(primal.shape, primal.shape + primal.rank);
    bo.buffer_grads.emplace(name, shape.size() == 1
                                      ? fa::TensorView(buf.as<void>(), fa::DType::f32, {shape[0]})
                                      : fa::TensorView(buf.as<void>(), fa::DType::f32, {shape[0], shape[1]}));
  }
  bo.sequences = seqs, bo.deterministic = c.deterministic, bo.dlse = c.dlse ? &dlsev : nullptr;
  auto run_backward = [&] {
    for (fa::rt::DeviceBuffer* g : {&d_dq, &d_dk, &d_dv}) g->memset8(0xFF);  // kPoison16
    for (auto& [name, buf] : d_bgrad) buf.memset8(0);                        // gradients accumulate
    kernel.backward(qv, kv, vv, ov, lsev, dov, dqv, dkv, dvv, mask, cap, bo);
    fa::rt::synchronize(nullptr);
  };
  run_backward();
  EXPECT_EQ(kernel.backward_spec().family,
            c.family == fa::KernelFamily::kMmaSync || kernel.spec().arch != "sm_90a"
                ? fa::KernelFamily::kMmaSync
                : fa::KernelFamily::kWgmma);
  auto download16 = [](fa::rt::DeviceBuffer& buf, size_t n) {
    std::vector<uint16_t> h(n);
    buf.download(h.data(), n * 2);
    return h;
  };
  const std::vector<uint16_t> gq = download16(d_dq, q.bits.size()), gk = download16(d_dk, k.bits.size()),
                              gv = download16(d_dv, v.bits.size()),
                              o_bits = download16(d_o, dout.bits.size());
  if (c.deterministic) {
    run_backward();
    EXPECT_TRUE(gq == download16(d_dq, gq.size()) && gk == download16(d_dk, gk.size()) &&
                gv == download16(d_dv, gv.size()))
        << "deterministic mode: gradients differ between two runs";
  }

  // The reference, sequence by sequence (mods that read b see it: b + 1 batches over the same
  // rows, the last one kept; their buffer gradients would count every batch, so those are
  // checked only where the mask reads no b).
  ModPrograms progs = mod_programs(kernel.program());
  std::optional<fa::ModProgram> grad;
  fa::Bindings env = caps.bindings();
  fa::ReferenceOptions ro;
  ro.mask_mod = &progs.mask, ro.bindings = &env;
  if (!kernel.program().score_is_identity()) {
    grad.emplace(fa::ModProgram::grad_of(kernel.program()));
    ro.score_mod = &progs.score, ro.score_grad = &*grad;
  }
  struct Err {
    double e2 = 0, r2 = 0;
    double rel() const { return r2 > 0 ? std::sqrt(e2 / r2) : std::sqrt(e2); }
  } eq, ek, ev;
  size_t nan = 0, nonzero = 0;
  std::string first_bad;
  std::map<std::string, std::vector<double>> bgrad_ref;
  // Packed row `row` of head h of a [rows, H, D] gradient against ref (null: must be 0).
  auto check_row = [&](const char* what, const std::vector<uint16_t>& g, int64_t row, int H, int h, int D,
                       const double* ref, Err& err) {
    for (int d = 0; d < D; ++d) {
      const float x = from_bits(c.dtype, g[size_t((row * H + h) * D + d)]);
      if (std::isnan(x) || (ref == nullptr && x != 0.f)) {
        ++(std::isnan(x) ? nan : nonzero);
        if (first_bad.empty()) first_bad = fmt::format("{} row {} h {} d {} = {}", what, row, h, d, x);
        continue;
      }
      const double want = ref ? ref[d] : 0.0;
      err.e2 += (x - want) * (x - want), err.r2 += want * want;
    }
  };
  for (int b = 0; b < B; ++b) {
    const int lq = c.lens_q[b], lkv = c.lens_kv[b];
    if (lq == 0 || lkv == 0) {  // no pair: every gradient of the sequence is 0
      for (int h = 0; h < c.Hq; ++h)
        for (int i = 0; i < lq; ++i) check_row("dq", gq, cu_q[b] + i, c.Hq, h, c.dqk, nullptr, eq);
      for (int h = 0; h < c.Hkv; ++h)
        for (int j = 0; j < lkv; ++j) {
          check_row("dk", gk, cu_k[b] + j, c.Hkv, h, c.dqk, nullptr, ek);
          check_row("dv", gv, cu_k[b] + j, c.Hkv, h, c.dv, nullptr, ev);
        }
      continue;
    }
    const int rb = var.mask_batch ? b + 1 : 1;
    // contiguous [rb, H, L, D] copies of the sequence's rows (every batch the same)
    auto gather = [&](auto&& at, int H, int L, int D, int64_t first) {
      std::vector<double> out(size_t(rb) * H * L * D);
      for (int r = 0; r < rb; ++r)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < L; ++i)
            for (int d = 0; d < D; ++d)
              out[((size_t(r) * H + h) * L + i) * D + d] = at(size_t(((first + i) * H + h) * D + d));
      return out;
    };
    auto vals = [&](const Tensor16& t) { return [&t](size_t i) { return double(t.vals[i]); }; };
    const std::vector<double> qs = gather(vals(q), c.Hq, lq, c.dqk, cu_q[b]),
                              ks = gather(vals(k), c.Hkv, lkv, c.dqk, cu_k[b]),
                              vs = gather(vals(v), c.Hkv, lkv, c.dv, cu_k[b]),
                              dos = gather(vals(dout), c.Hq, lq, c.dv, cu_q[b]),
                              os = gather([&](size_t i) { return double(from_bits(c.dtype, o_bits[i])); },
                                          c.Hq, lq, c.dv, cu_q[b]),
                              dls = gather([&](size_t i) { return double(dlse[(i % c.Hq) * tq + i / c.Hq]); },
                                           c.Hq, lq, 1, cu_q[b]);
    const std::vector<float> qf(qs.begin(), qs.end()), kf(ks.begin(), ks.end()), vf(vs.begin(), vs.end());
    ro.delta_out = os.data();
    const fa::ReferenceGrads ref =
        fa::reference_attention_backward({rb, c.Hq, c.Hkv, lq, lkv, c.dqk, c.dv}, qf.data(), kf.data(),
                                         vf.data(), dos.data(), c.dlse ? dls.data() : nullptr, ro);
    const size_t lq_last = size_t(rb - 1) * c.Hq, lk_last = size_t(rb - 1) * c.Hkv;
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < lq; ++i) {
        const size_t r = (lq_last + h) * lq + i;
        const bool empty = std::isinf(ref.forward.lse[r]);  // the mask empties the row
        check_row("dq", gq, cu_q[b] + i, c.Hq, h, c.dqk, empty ? nullptr : &ref.dq[r * c.dqk], eq);
      }
    for (int h = 0; h < c.Hkv; ++h)
      for (int j = 0; j < lkv; ++j) {
        const size_t r = (lk_last + h) * lkv + j;
        bool unseen = true;  // no query sees the key: its dV row, a sum of P > 0 terms, is 0
        for (int d = 0; d < c.dv; ++d) unseen = unseen && ref.dv[r * c.dv + d] == 0.0;
        check_row("dk", gk, cu_k[b] + j, c.Hkv, h, c.dqk, unseen ? nullptr : &ref.dk[r * c.dqk], ek);
        check_row("dv", gv, cu_k[b] + j, c.Hkv, h, c.dv, unseen ? nullptr : &ref.dv[r * c.dv], ev);
      }
    for (const auto& [name, g] : ref.buffer_grads) {
      std::vector<double>& sum = bgrad_ref[name];
      sum.resize(g.size());
      for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
  }
  const double tol = c.dtype == fa::DType::bf16 ? 3e-2 : 1e-2;
  std::printf("[ stats    ] dq rel %.2e | dk rel %.2e | dv rel %.2e  nan %zu nonzero %zu  (seed %u)\n",
              eq.rel(), ek.rel(), ev.rel(), nan, nonzero, seed);
  EXPECT_EQ(nan, 0u) << first_bad;
  EXPECT_EQ(nonzero, 0u) << first_bad;
  EXPECT_LT(eq.rel(), tol);
  EXPECT_LT(ek.rel(), tol);
  EXPECT_LT(ev.rel(), tol);
  if (var.mask_batch) return;
  for (auto& [name, buf] : d_bgrad) {
    const std::vector<double>& r = bgrad_ref.at(name);
    std::vector<float> got(r.size());
    buf.download(got.data(), got.size() * 4);
    Err e;
    for (size_t i = 0; i < r.size(); ++i) e.e2 += (got[i] - r[i]) * (got[i] - r[i]), e.r2 += r[i] * r[i];
    std::printf("[ stats    ] d%s rel %.2e\n", name.c_str(), e.rel());
    EXPECT_LT(e.rel(), tol) << "d" << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RaggedBackwardTest, ::testing::ValuesIn(ragged_bwd_cases()),
                         [](const ::testing::TestParamInfo<RaggedBwdCase>& i) { return i.param.name(); });

}  // namespace
}  // namespace fa_gpu_test
