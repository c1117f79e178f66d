// Tests of fa::analyze_block_mask (compiler/include/fajit/detail/mask_analysis.h): analysis plus the
// CPU fallback equals fa::brute_force_block_classes exactly; the affine library masks are
// decided completely; the fa-mask-block-range pass agrees with the interval program.
#include "fajit/detail/mask_analysis.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../../compiler/lib/api/forward_mask.h"
#include "fa_test_util.h"
#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/Dialect/FA/Passes.h"
#include "fajit/analysis/range_program.h"
#include "fajit/detail/program_impl.h"
#include "fajit/detail/reference.h"
#include "fajit/error.h"
#include "fajit/kernel.h"
#include "fajit/mods.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

namespace {

fa::ModProgram mask_program(const fa::Program& p) {
  return fa::ModProgram::compile(p.impl().mask.getOperation());
}

struct Case {
  int batch = 1, heads = 1, len_q = 0, len_kv = 0, q_block = 128, kv_block = 128;
};

// Analysis (+ CPU fallback for what it leaves undecided) vs brute force, on the reduced
// [Bm, Hm] the analysis chose.
fa::MaskAnalysis check_exact(const fa::Program& p, const fa::Bindings& env, const fa::Captures& cap,
                             const Case& c, const std::string& what) {
  fa::MaskAnalysis a =
      fa::analyze_block_mask(p, c.batch, c.heads, c.len_q, c.len_kv, c.q_block, c.kv_block, cap);
  // Every decided block is right before the fallback runs.
  std::vector<uint8_t> want = fa::brute_force_block_classes(mask_program(p), env, a.batch, a.heads, c.len_q,
                                                            c.len_kv, c.q_block, c.kv_block);
  EXPECT_EQ(a.kinds.size(), want.size()) << what;
  for (size_t i = 0; i < want.size() && i < a.kinds.size(); ++i)
    if (a.kinds[i] != fa::kUndecidedBlock && a.kinds[i] != want[i]) {
      ADD_FAILURE() << what << ": block " << i << " decided " << int(a.kinds[i]) << ", brute force "
                    << int(want[i]) << " (Lq " << c.len_q << " Lkv " << c.len_kv << " blocks " << c.q_block
                    << "x" << c.kv_block << ")\n"
                    << p.to_mlir();
      break;
    }
  fa::MaskAnalysis done = a;
  fa::evaluate_undecided_blocks(done, mask_program(p), env, c.len_q, c.len_kv, c.q_block, c.kv_block);
  EXPECT_EQ(done.undecided, 0) << what;
  EXPECT_EQ(done.kinds, want) << what;
  return a;
}

TEST(MaskAnalysis, LibraryMasksAreDecidedCompletely) {
  struct Lib {
    fa::MaskMod mod;
    const char* scalar;
    std::vector<int> values;
  };
  std::vector<Lib> libs = {{fa::mods::causal(), nullptr, {0}},
                           {fa::mods::sliding_window(), "window", {0, 1, 5, 100, 127, 128, 300, 5000}},
                           {fa::mods::prefix_lm(), "prefix", {0, 1, 64, 200, 1000, 5000}},
                           {fa::mods::padding(), "n_pad", {0, 3, 128, 250, 5000}},
                           {fa::noop_mask(), nullptr, {0}}};
  const Case cases[] = {{1, 1, 1024, 1024, 128, 128}, {1, 1, 1000, 1000, 128, 128},
                        {1, 1, 300, 1100, 64, 128},   {1, 1, 1100, 300, 128, 32},
                        {1, 1, 1, 1, 128, 128},       {1, 1, 777, 777, 16, 48}};
  for (const Lib& l : libs) {
    fa::Program p = fa::trace(fa::identity_score(), l.mod);
    for (int v : l.values)
      for (const Case& c : cases) {
        fa::Bindings env;
        fa::Captures cap;
        if (l.scalar) {
          env.scalar_i32(l.scalar, v);
          cap.scalar(l.scalar, v);
        }
        std::string what = l.mod.name + (l.scalar ? ":" + std::to_string(v) : "");
        fa::MaskAnalysis a = check_exact(p, env, cap, c, what);
        EXPECT_EQ(a.undecided, 0) << what << " Lq " << c.len_q << " Lkv " << c.len_kv;
        EXPECT_EQ(a.batch, 1);
        EXPECT_EQ(a.heads, 1);
      }
  }
}

// ---- random and/or trees of affine atoms ----------------------------------------------------

struct Node {
  int op = 0;  // 0 atom, 1 and, 2 or, 3 not
  int atom = 0, x = 0, y = 0;
  std::vector<std::shared_ptr<Node>> kids;
};

fa::Bool eval_node(const Node& n, fa::Index q, fa::Index kv) {
  using fa::Index;
  switch (n.op) {
    case 1: return eval_node(*n.kids[0], q, kv) && eval_node(*n.kids[1], q, kv);
    case 2: return eval_node(*n.kids[0], q, kv) || eval_node(*n.kids[1], q, kv);
    case 3: return !eval_node(*n.kids[0], q, kv);
    default: break;
  }
  switch (n.atom) {
    case 0: return q + Index(n.x) >= kv;                                 // causal with an offset (Lkv - Lq)
    case 1: return q - kv <= Index(n.x);                                 // window bound
    case 2: return kv - q <= Index(n.x);                                 // look-ahead bound
    case 3: return kv < Index(n.x);                                      // prefix / kv length
    case 4: return q >= Index(n.x);                                      // padding of q
    case 5: return kv >= Index(n.x);                                     // padding of kv
    case 6: return fa::abs(q - kv + Index(n.y)) <= Index(n.x);           // symmetric band
    case 7: return q < Index(n.x);                                       // q length
    case 8: return fa::min(q, Index(n.y)) - kv > Index(n.x);             // clamped
    case 9: return q * Index(2) - kv * Index(3) < Index(n.x);            // other slopes
    case 10: return q / Index(64) == kv / Index(64);                     // block-diagonal (non-affine)
    case 11: return (q - kv) % Index(n.y) == Index(0);                   // dilated (non-affine)
    default: return fa::where(q > kv, Index(n.x), Index(n.y)) < q - kv;  // select
  }
}

std::shared_ptr<Node> random_tree(std::mt19937& rng, int depth) {
  auto n = std::make_shared<Node>();
  std::uniform_int_distribution<int> op(0, depth > 0 ? 3 : 0);
  n->op = op(rng);
  if (n->op == 0) {
    n->atom = std::uniform_int_distribution<int>(0, 12)(rng);
    n->x = std::uniform_int_distribution<int>(-300, 900)(rng);
    n->y = std::uniform_int_distribution<int>(1, 9)(rng);
    return n;
  }
  n->kids.push_back(random_tree(rng, depth - 1));
  if (n->op != 3) n->kids.push_back(random_tree(rng, depth - 1));
  return n;
}

TEST(MaskAnalysis, RandomCompositionsMatchBruteForce) {
  std::mt19937 rng(20261121);
  int64_t decided = 0, total = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::shared_ptr<Node> tree = random_tree(rng, 3);
    fa::MaskMod m{"random", [tree](fa::Index, fa::Index, fa::Index q, fa::Index kv) {
                    return eval_node(*tree, q, kv);
                  }};
    fa::Program p = fa::trace(fa::identity_score(), m);
    const int blocks[] = {16, 32, 64, 128};
    Case c;
    c.len_q = std::uniform_int_distribution<int>(1, 900)(rng);
    c.len_kv = std::uniform_int_distribution<int>(1, 900)(rng);
    c.q_block = blocks[rng() % 4];
    c.kv_block = blocks[rng() % 4];
    fa::MaskAnalysis a = check_exact(p, fa::Bindings{}, fa::Captures{}, c, "random #" + std::to_string(iter));
    decided += a.decided;
    total += int64_t(a.kinds.size());
    if (HasFailure()) break;
  }
  // Most blocks of these (mostly affine) masks are decided without element evaluation.
  EXPECT_GT(double(decided) / double(total), 0.9) << decided << " of " << total;
}

TEST(MaskAnalysis, DataDependentMasksFallBack) {
  // document: every block reads doc_ids; with causal the upper triangle is still decided.
  std::vector<int32_t> doc(1000);
  for (int i = 0; i < 1000; ++i) doc[i] = i / 137;
  fa::Bindings env;
  env.buffer("doc_ids", fa::HostBuffer::i32(doc.data(), {1000}));
  fa::Program plain = fa::trace(fa::identity_score(), fa::mods::document());
  fa::MaskAnalysis a = check_exact(plain, env, fa::Captures{}, {1, 1, 1000, 1000, 128, 128}, "document");
  EXPECT_GT(a.undecided, 0);
  EXPECT_TRUE(a.reads_buffers);
  fa::Program causal_doc =
      fa::trace(fa::identity_score(), fa::and_masks({fa::mods::causal(), fa::mods::document()}));
  fa::MaskAnalysis b =
      check_exact(causal_doc, env, fa::Captures{}, {1, 1, 1000, 1000, 128, 128}, "causal document");
  EXPECT_GE(b.decided, 8 * 7 / 2);  // the empty upper triangle
  // dilated sliding window: no buffers, non-affine; the analysis is still exact where it decides.
  fa::Program dil = fa::trace(fa::identity_score(), fa::mods::dilated_sliding_window());
  for (int w : {0, 50, 300})
    for (int d : {1, 2, 3, 7}) {
      fa::Bindings e;
      e.scalar_i32("window", w).scalar_i32("dilation", d);
      fa::Captures cap;
      cap.scalar("window", w).scalar("dilation", d);
      check_exact(dil, e, cap, {1, 1, 700, 900, 64, 32}, "dilated");
    }
}

TEST(MaskAnalysis, DependenceKeepsOnlyWhatTheMaskReads) {
  fa::MaskMod per_head{"per_head", [](fa::Index, fa::Index h, fa::Index q, fa::Index kv) {
                         return q - kv <= h * fa::Index(100) && q >= kv;
                       }};
  fa::Program p = fa::trace(fa::identity_score(), per_head);
  fa::MaskAnalysis a = check_exact(p, fa::Bindings{}, fa::Captures{}, {3, 4, 500, 500, 64, 64}, "per_head");
  EXPECT_EQ(a.batch, 1);
  EXPECT_EQ(a.heads, 4);
  EXPECT_EQ(a.undecided, 0);
  fa::MaskMod per_batch{"per_batch", [](fa::Index b, fa::Index, fa::Index q, fa::Index kv) {
                          return kv < (b + fa::Index(1)) * fa::Index(77) || q >= kv;
                        }};
  fa::Program pb = fa::trace(fa::identity_score(), per_batch);
  fa::MaskAnalysis c = check_exact(pb, fa::Bindings{}, fa::Captures{}, {3, 4, 300, 300, 32, 64}, "per_batch");
  EXPECT_EQ(c.batch, 3);
  EXPECT_EQ(c.heads, 1);
}

// A mask reading b (or h) only to pick its loads is decided alike for every (b, h): one is
// analysed and copied. Where b also reaches the verdict otherwise, each is analysed.
TEST(MaskAnalysis, BAndHReachingOnlyLoadsAreDecidedOnce) {
  const int B = 3, H = 2, L = 700;
  std::vector<int32_t> doc(size_t(B) * L);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < L; ++i) doc[size_t(b) * L + i] = i / (90 + 70 * b);
  fa::Bindings env;
  env.buffer("doc_ids", fa::HostBuffer::i32(doc.data(), {B, L}));
  fa::MaskMod by_load{"doc2d_causal", [](fa::Index b, fa::Index, fa::Index q, fa::Index kv) {
                        auto d = fa::buffer<int32_t>("doc_ids", 2);
                        return q >= kv && d(b, q) == d(b, kv);
                      }};
  fa::MaskMod by_b_too{"doc2d_or_prefix", [](fa::Index b, fa::Index h, fa::Index q, fa::Index kv) {
                         auto d = fa::buffer<int32_t>("doc_ids", 2);
                         return (kv < (b + fa::Index(1)) * fa::Index(77) || q >= kv + h * fa::Index(200)) &&
                                d(b, q) == d(b, kv);
                       }};
  fa::Program p = fa::trace(fa::identity_score(), by_load);
  const fa::MaskRangeProgram rp = fa::MaskRangeProgram::compile(p);
  EXPECT_TRUE(rp.reads_b());
  EXPECT_FALSE(rp.fields().verdict_reads_b);
  EXPECT_FALSE(rp.fields().verdict_reads_h);
  fa::MaskAnalysis a = check_exact(p, env, fa::Captures{}, {B, H, L, L, 64, 64}, "doc2d_causal");
  EXPECT_EQ(a.batch, B);
  EXPECT_EQ(a.heads, 1);
  const size_t per = a.kinds.size() / B;
  EXPECT_GE(a.decided, B * int64_t(11 * 10 / 2));  // every batch's empty upper triangle
  EXPECT_EQ(a.undecided, B * std::count(a.kinds.begin(), a.kinds.begin() + per, fa::kUndecidedBlock));
  fa::Program pb = fa::trace(fa::identity_score(), by_b_too);
  const fa::MaskRangeProgram rpb = fa::MaskRangeProgram::compile(pb);
  EXPECT_TRUE(rpb.fields().verdict_reads_b);
  EXPECT_TRUE(rpb.fields().verdict_reads_h);
  fa::MaskAnalysis c = check_exact(pb, env, fa::Captures{}, {B, H, L, L, 64, 64}, "doc2d_or_prefix");
  EXPECT_EQ(c.batch, B);
  EXPECT_EQ(c.heads, H);
  // Each (b, h) decided by its own bounds: the tables differ.
  const size_t per_c = c.kinds.size() / (B * H);
  EXPECT_FALSE(std::equal(c.kinds.begin(), c.kinds.begin() + per_c, c.kinds.begin() + per_c));
  EXPECT_FALSE(std::equal(c.kinds.begin(), c.kinds.begin() + per_c, c.kinds.begin() + H * per_c));
}

TEST(MaskAnalysis, FloatAndUnsignedArithmeticIsSound) {
  fa::MaskMod f{"float_band", [](fa::Index, fa::Index, fa::Index q, fa::Index kv) {
                  fa::Score d = fa::to_float(q - kv) * fa::Score(0.5f);
                  return d >= fa::Score(0.0f) && d < fa::scalar<float>("half_window").value();
                }};
  fa::Program p = fa::trace(fa::identity_score(), f);
  fa::Bindings env;
  env.scalar_f32("half_window", 40.5f);
  fa::Captures cap;
  cap.scalar("half_window", 40.5f);
  fa::MaskAnalysis a = check_exact(p, env, cap, {1, 1, 600, 600, 32, 32}, "float_band");
  EXPECT_EQ(a.undecided, 0);
  // Without the scalar bound the analysis must not claim anything the value could change.
  fa::MaskAnalysis u = fa::analyze_block_mask(p, 1, 1, 600, 600, 32, 32, fa::Captures{});
  for (uint8_t k : u.kinds) EXPECT_TRUE(k == 0 || k == fa::kUndecidedBlock || k == 1);
  // Wrap-around: q * 2^30 overflows; the analysis must widen, not decide wrongly.
  fa::MaskMod wrap{"wrap", [](fa::Index, fa::Index, fa::Index q, fa::Index kv) {
                     return q * fa::Index(1 << 30) + kv >= fa::Index(0);
                   }};
  check_exact(fa::trace(fa::identity_score(), wrap), fa::Bindings{}, fa::Captures{}, {1, 1, 300, 300, 16, 16},
              "wrap");
}

TEST(MaskAnalysis, Errors) {
  fa::Program p = fa::trace(fa::identity_score(), fa::mods::causal());
  EXPECT_THROW(fa::analyze_block_mask(p, 0, 1, 10, 10, 128, 128, fa::Captures{}), fa::Error);
  EXPECT_THROW(fa::analyze_block_mask(p, 1, 1, 10, 10, 0, 128, fa::Captures{}), fa::Error);
}

// ---- the MLIR pass agrees with the interval program on the library masks --------------------

std::string pass_verdict(const fa::Program& p, int64_t q0, int64_t k0, int64_t size,
                         const std::vector<std::string>& scalars) {
  std::unique_ptr<mlir::MLIRContext> ctx = fa::detail::make_context();
  mlir::OwningOpRef<mlir::ModuleOp> m = mlir::parseSourceString<mlir::ModuleOp>(p.to_mlir(), ctx.get());
  if (!m) return "parse error";
  mlir::PassManager pm(ctx.get());
  mlir::fa::FAMaskBlockRangeOptions o;
  o.q0 = q0;
  o.q1 = q0 + size - 1;
  o.k0 = k0;
  o.k1 = k0 + size - 1;
  o.b1 = 0;
  o.h1 = 0;
  o.scalars = scalars;
  pm.addPass(mlir::fa::createFAMaskBlockRange(o));
  if (mlir::failed(pm.run(*m))) return "pass failed";
  for (auto mask : m->getBody()->getOps<mlir::fa::MaskModOp>())
    if (auto a = mask->getAttrOfType<mlir::StringAttr>("fa.block")) return a.getValue().str();
  return "no attribute";
}

TEST(MaskAnalysis, PassAgreesWithIntervalProgram) {
  struct Lib {
    fa::MaskMod mod;
    const char* scalar;
    int value;
  };
  std::vector<Lib> libs = {{fa::mods::causal(), nullptr, 0},
                           {fa::mods::sliding_window(), "window", 100},
                           {fa::mods::prefix_lm(), "prefix", 200},
                           {fa::mods::padding(), "n_pad", 150}};
  for (const Lib& l : libs) {
    fa::Program p = fa::trace(fa::identity_score(), l.mod);
    fa::MaskRangeProgram rp = fa::MaskRangeProgram::compile(p);
    fa::ScalarValues sv;
    if (l.scalar) {
      fa::ScalarValue v;
      v.type = fa::ScalarType::kI32;
      v.i = l.value;
      sv[l.scalar] = v;
    }
    int checked = 0;
    for (int qb = 0; qb < 4; ++qb)
      for (int kb = 0; kb < 4; ++kb) {
        int64_t q0 = qb * 128, k0 = kb * 128;
        fa::MaskVerdict v = rp.eval({0, 0}, {0, 0}, {q0, q0 + 127}, {k0, k0 + 127}, sv);
        std::vector<std::string> scalars;
        if (l.scalar) scalars.push_back(std::string(l.scalar) + "=" + std::to_string(l.value));
        std::string want = v == fa::MaskVerdict::kTrue    ? "full"
                           : v == fa::MaskVerdict::kFalse ? "empty"
                                                          : "partial?";
        EXPECT_EQ(pass_verdict(p, q0, k0, 128, scalars), want) << l.mod.name << " q0=" << q0 << " k0=" << k0;
        ++checked;
      }
    EXPECT_EQ(checked, 16);
  }
}

}  // namespace

// BlockMask::regrouped (the Hopper forward's 192x128 and 192x112 tiles over 128x128 masks, and a
// wider column block):
// each regrouped tile joins the tiles it overlaps (full where all are full, empty where all are
// empty, else partial), so its full and empty tiles are exactly what brute force finds at the
// new size, and it is kept with the mask.
TEST(MaskAnalysis, RegroupedMasksAreSound) {
  const fa::MaskMod band{"band", [](fa::Index, fa::Index, fa::Index q, fa::Index kv) {
                           return kv <= q + fa::Index(200) && kv + fa::Index(300) >= q;
                         }};
  const int len_q = 1000, len_kv = 777;
  for (const fa::MaskMod& mm : {fa::mods::causal(), band})
    for (int source : {64, 128, 256})
      for (const auto& [qb, kvb] : {std::pair{192, 128}, std::pair{192, 112}, std::pair{128, 176}}) {
        const std::string what = mm.name + " from " + std::to_string(source) + "x128 to " +
                                 std::to_string(qb) + "x" + std::to_string(kvb);
        fa::BlockMaskOptions bo;
        bo.q_block = source;
        const fa::BlockMask m = fa::create_block_mask(mm, 1, 1, len_q, len_kv, {}, bo);
        EXPECT_TRUE(m.matches_mask_mod()) << what;
        EXPECT_EQ(&m.regrouped(source, 128), &m) << what;
        const fa::BlockMask& r = m.regrouped(qb, kvb);
        EXPECT_EQ(&m.regrouped(qb, kvb), &r) << what;  // built once
        EXPECT_TRUE(r.matches_mask_mod()) << what;
        ASSERT_EQ(r.q_block(), qb) << what;
        ASSERT_EQ(r.kv_block(), kvb) << what;
        ASSERT_EQ(r.num_q_blocks(), (len_q + qb - 1) / qb) << what;
        ASSERT_EQ(r.num_kv_blocks(), (len_kv + kvb - 1) / kvb) << what;
        const std::vector<uint8_t> exact = fa::brute_force_block_classes(
            mask_program(fa::trace(fa::identity_score(), mm)), {}, 1, 1, len_q, len_kv, qb, kvb);
        int partial = 0;
        for (int i = 0; i < r.num_q_blocks(); ++i)
          for (int j = 0; j < r.num_kv_blocks(); ++j) {
            // the definition: the kinds of the source tiles over rows [qb i, min(qb (i + 1), Lq))
            // and columns [kvb j, min(kvb (j + 1), Lkv))
            const int first = qb * i / source, last = (std::min(qb * (i + 1), len_q) - 1) / source;
            const int c0 = kvb * j / 128, c1 = (std::min(kvb * (j + 1), len_kv) - 1) / 128;
            fa::BlockKind join = m.kind(0, 0, first, c0);
            for (int s = first; s <= last; ++s)
              for (int c = c0; c <= c1; ++c)
                if (m.kind(0, 0, s, c) != join) join = fa::BlockKind::kPartial;
            const fa::BlockKind got = r.kind(0, 0, i, j);
            EXPECT_EQ(got, join) << what << " tile " << i << "," << j;
            if (got != fa::BlockKind::kPartial) {
              EXPECT_EQ(uint8_t(got), exact[size_t(i) * r.num_kv_blocks() + j])
                  << what << " tile " << i << "," << j;
            } else {
              ++partial;
            }
          }
        EXPECT_GT(partial, 0) << what;  // the join was exercised
        // The 64-row sub-blocks of a 192-row tile: sound at 64 rows (an empty or full one is
        // what brute force finds there), empty past len_q, joining to the tile's kind; some
        // of a partial tile's are not partial where the tile is taller than the mask's blocks
        // (what the forward's warpgroups skip).
        if (qb == source) {
          EXPECT_TRUE(r.sub_kinds().empty()) << what;
          continue;
        }
        ASSERT_EQ(r.sub_kinds().size(), r.kinds().size()) << what;
        const std::vector<uint8_t> exact64 = fa::brute_force_block_classes(
            mask_program(fa::trace(fa::identity_score(), mm)), {}, 1, 1, len_q, len_kv, 64, kvb);
        int decided = 0;
        for (int i = 0; i < r.num_q_blocks(); ++i)
          for (int j = 0; j < r.num_kv_blocks(); ++j) {
            const uint8_t sub = r.sub_kinds()[size_t(i) * r.num_kv_blocks() + j];
            std::optional<fa::BlockKind> join;
            for (int c = 0; c < qb / 64; ++c) {
              const auto k = fa::BlockKind((sub >> (2 * c)) & 3);
              const int row0 = qb * i + 64 * c;
              if (row0 >= len_q) {
                EXPECT_EQ(k, fa::BlockKind::kEmpty) << what << " tile " << i << "," << j << " sub " << c;
                continue;
              }
              if (k != fa::BlockKind::kPartial) {
                EXPECT_EQ(uint8_t(k), exact64[size_t(row0 / 64) * r.num_kv_blocks() + j])
                    << what << " tile " << i << "," << j << " sub " << c;
                decided += r.kind(0, 0, i, j) == fa::BlockKind::kPartial;
              }
              join = !join || *join == k ? k : fa::BlockKind::kPartial;
            }
            EXPECT_EQ(join, r.kind(0, 0, i, j)) << what << " tile " << i << "," << j;
          }
        if (qb > source) {  // taller blocks than the mask's
          EXPECT_GT(decided, 0) << what;
        }
      }
  // Tables given as such may override mask_mod (flex_attention's meaning): regrouped only
  // where every tile has one kind (all full: exact whatever the mask_mod).
  const fa::BlockMask full = fa::BlockMask::all_full(1, 1, 1000, 1000);
  EXPECT_FALSE(full.matches_mask_mod());
  EXPECT_TRUE(full.regroupable());
  EXPECT_EQ(full.regrouped(192, 128).kinds(), std::vector<uint8_t>(6 * 8, uint8_t(fa::BlockKind::kFull)));
  EXPECT_EQ(full.regrouped(192, 112).kinds(), std::vector<uint8_t>(6 * 9, uint8_t(fa::BlockKind::kFull)));
  std::vector<uint8_t> kinds(8 * 8, uint8_t(fa::BlockKind::kFull));
  kinds[1] = uint8_t(fa::BlockKind::kEmpty);
  kinds[10] = uint8_t(fa::BlockKind::kPartial);
  const fa::BlockMask given = fa::BlockMask::from_kinds(1, 1, 1000, 1000, kinds);
  EXPECT_FALSE(given.regroupable());
  EXPECT_EQ(&given.regrouped(128, 128), &given);
  EXPECT_TRUE(given.sub_kinds().empty());                     // not regrouped
  EXPECT_TRUE(full.regrouped(128, 112).sub_kinds().empty());  // q blocks as they were
  EXPECT_EQ(full.regrouped(192, 128).sub_kinds().size(), size_t(6 * 8));
  // Splitting blocks is exact whatever the tables (each part keeps its block's kind): the wgmma
  // forward splits wider kv blocks into its BLOCK_N this way (256 -> 128, 128 -> 64).
  std::vector<uint8_t> kinds256(8 * 4, uint8_t(fa::BlockKind::kFull));
  kinds256[2] = uint8_t(fa::BlockKind::kEmpty), kinds256[5] = uint8_t(fa::BlockKind::kPartial);
  kinds256[31] = uint8_t(fa::BlockKind::kPartial);  // the tail block (keys 768-999)
  const fa::BlockMask given256 = fa::BlockMask::from_kinds(1, 1, 1000, 1000, kinds256, 128, 256);
  fa::BlockMask matching = fa::BlockMask::from_kinds(1, 1, 1000, 1000, kinds256, 128, 256);
  matching.set_matches_mask_mod();
  for (const fa::BlockMask* source :
       std::initializer_list<const fa::BlockMask*>{&given, &given256, &matching})
    for (const auto& [qb, kvb] : {std::pair{128, 128}, {128, 64}, {64, 128}, {64, 32}}) {
      const int sq = source->q_block(), skv = source->kv_block();
      if (sq % qb != 0 || skv % kvb != 0 || (qb == sq && kvb == skv)) continue;
      const std::string what = std::to_string(sq) + "x" + std::to_string(skv) + " -> " + std::to_string(qb) +
                               "x" + std::to_string(kvb);
      const fa::BlockMask& split = source->regrouped(qb, kvb);
      EXPECT_EQ(&source->regrouped(qb, kvb), &split) << what;  // built once
      const int nq = split.num_q_blocks(), nkv = split.num_kv_blocks();
      ASSERT_EQ(nq, (1000 + qb - 1) / qb) << what;
      ASSERT_EQ(nkv, (1000 + kvb - 1) / kvb) << what;
      EXPECT_EQ(split.matches_mask_mod(), source->matches_mask_mod()) << what;
      EXPECT_TRUE(split.sub_kinds().empty()) << what;
      for (int i = 0; i < nq; ++i)
        for (int j = 0; j < nkv; ++j)
          EXPECT_EQ(split.kind(0, 0, i, j), source->kind(0, 0, i * qb / sq, j * kvb / skv))
              << what << " tile " << i << "," << j;
    }
  EXPECT_TRUE(matching.regrouped(128, 128).matches_mask_mod());
  EXPECT_EQ(fa::test::error_of([&] { given.regrouped(192, 112); }),
            "block mask: its 128x128 blocks can be regrouped into 192x112 only when the tables agree with "
            "mask_mod (a mask built by Kernel::block_mask or create_block_mask) or hold one kind of tile; "
            "given tables, build them with blocks 192x112");
  EXPECT_EQ(fa::test::error_of([&] {
              fa::BlockMask::all_full(1, 1, 1000, 1000).set_matches_mask_mod().regrouped(100, 128);
            }),
            "block mask: block sizes must be positive multiples of 16, got 100x128");
}

// BlockMask::regrouped_led: blocks of q_block rows, the first starting q_offset rows before query
// 0 (the persistent Hopper forward with its partial block first). Each tile joins the source
// tiles over its rows in [0, Lq); its 64-row sub-blocks are empty before query 0 and past Lq and
// sound elsewhere (an empty or full one is what brute force finds there); a full or empty tile
// is what its sub-blocks' brute-force kinds join to.
TEST(MaskAnalysis, LedRegroupingsAreSound) {
  const fa::MaskMod band{"band", [](fa::Index, fa::Index, fa::Index q, fa::Index kv) {
                           return kv <= q + fa::Index(200) && kv + fa::Index(300) >= q;
                         }};
  const int len_kv = 777;
  int checked = 0;
  for (const fa::MaskMod& mm : {fa::mods::causal(), band})
    for (int source : {64, 128, 256})
      for (const auto& [len_q, qb] : {std::pair{1024, 192}, std::pair{896, 192}, std::pair{320, 192},
                                      std::pair{960, 128}, std::pair{64, 192}})
        for (int kvb : {128, 112}) {
          const int off = qb - len_q % qb;
          const std::string what = mm.name + " Lq " + std::to_string(len_q) + " from " +
                                   std::to_string(source) + " to " + std::to_string(qb) + "x" +
                                   std::to_string(kvb) + " led " + std::to_string(off);
          fa::BlockMaskOptions bo;
          bo.q_block = source;
          const fa::BlockMask m = fa::create_block_mask(mm, 1, 1, len_q, len_kv, {}, bo);
          const fa::BlockMask& r = m.regrouped_led(qb, kvb, off);
          EXPECT_EQ(&m.regrouped_led(qb, kvb, off), &r) << what;  // built once
          EXPECT_NE(&m.regrouped(qb, kvb), &r) << what;           // apart from the plain one
          EXPECT_EQ(&m.regrouped_led(qb, kvb, 0), &m.regrouped(qb, kvb)) << what;
          EXPECT_EQ(r.q_offset(), off) << what;
          EXPECT_EQ(m.q_offset(), 0) << what;
          EXPECT_TRUE(r.matches_mask_mod()) << what;
          ASSERT_EQ(r.num_q_blocks(), (len_q + off + qb - 1) / qb) << what;
          ASSERT_EQ(r.sub_kinds().size(), r.kinds().size()) << what;
          const std::vector<uint8_t> exact64 = fa::brute_force_block_classes(
              mask_program(fa::trace(fa::identity_score(), mm)), {}, 1, 1, len_q, len_kv, 64, kvb);
          for (int i = 0; i < r.num_q_blocks(); ++i)
            for (int j = 0; j < r.num_kv_blocks(); ++j) {
              const int r0 = std::max(qb * i - off, 0), r1 = std::min(qb * (i + 1) - off, len_q) - 1;
              ASSERT_LE(r0, r1) << what;  // every block holds rows
              const int c0 = kvb * j / 128, c1 = (std::min(kvb * (j + 1), len_kv) - 1) / 128;
              fa::BlockKind join = m.kind(0, 0, r0 / source, c0);
              for (int s = r0 / source; s <= r1 / source; ++s)
                for (int c = c0; c <= c1; ++c)
                  if (m.kind(0, 0, s, c) != join) join = fa::BlockKind::kPartial;
              const fa::BlockKind got = r.kind(0, 0, i, j);
              EXPECT_EQ(got, join) << what << " tile " << i << "," << j;
              const uint8_t sub = r.sub_kinds()[size_t(i) * r.num_kv_blocks() + j];
              std::optional<uint8_t> exact;  // the join of the sub-blocks' brute-force kinds
              for (int c = 0; c < qb / 64; ++c) {
                const auto k = uint8_t((sub >> (2 * c)) & 3);
                const int row0 = qb * i - off + 64 * c;
                if (row0 < 0 || row0 >= len_q) {
                  EXPECT_EQ(k, uint8_t(fa::BlockKind::kEmpty))
                      << what << " tile " << i << "," << j << " sub " << c;
                  continue;
                }
                const uint8_t e = exact64[size_t(row0 / 64) * r.num_kv_blocks() + j];
                if (k != uint8_t(fa::BlockKind::kPartial)) {
                  EXPECT_EQ(k, e) << what << " tile " << i << "," << j;
                }
                exact = !exact || *exact == e ? e : uint8_t(fa::BlockKind::kPartial);
              }
              if (got != fa::BlockKind::kPartial) {
                EXPECT_EQ(uint8_t(got), *exact) << what << " tile " << i << "," << j;
              }
              ++checked;
            }
        }
  EXPECT_GT(checked, 1000);
  // Bad offsets, and masks it does not take.
  const fa::BlockMask causal = fa::create_block_mask(fa::mods::causal(), 1, 1, 1024, 1024);
  EXPECT_EQ(
      fa::test::error_of([&] { causal.regrouped_led(192, 128, 96); }),
      "block mask: a first block's q offset must be a multiple of 64 below the block's 192 rows, got 96");
  EXPECT_EQ(
      fa::test::error_of([&] { causal.regrouped_led(192, 128, 192); }),
      "block mask: a first block's q offset must be a multiple of 64 below the block's 192 rows, got 192");
  const fa::BlockMask& led = causal.regrouped_led(192, 128, 128);
  for (auto again : std::vector<std::function<void()>>{
           [&] { led.regrouped(128, 128); }, [&] { led.regrouped(192, 128); },  // its own sizes
           [&] { led.regrouped_led(192, 128, 0); }, [&] { led.regrouped_led(192, 128, 64); }})
    EXPECT_EQ(fa::test::error_of(again),
              "block mask: a mask regrouped with its first block before query 0 is not regrouped again");
  FaBlockTables transposed{};
  EXPECT_EQ(fa::test::error_of([&] { led.fill_transposed(transposed); }),
            "block mask: a mask regrouped with its first block before query 0 has no transposed tables");
  // Shifted, 384-row blocks regrouped into 192 merge halves: only masks that may merge.
  std::vector<uint8_t> mixed(3 * 8, 1);
  mixed[0] = 2;  // a full tile among partial ones: not one kind
  const fa::BlockMask given = fa::BlockMask::from_kinds(1, 1, 1024, 1024, mixed, 384, 128);
  EXPECT_EQ(fa::test::error_of([&] { given.regrouped_led(192, 128, 128); }),
            "block mask: its 384x128 blocks can be regrouped with a q offset only when the tables agree with "
            "mask_mod (a mask built by Kernel::block_mask or create_block_mask) or hold one kind of tile");
  // A mask of several heads: each head's tiles regrouped alike.
  const fa::MaskMod head_band{"head_band", [](fa::Index, fa::Index h, fa::Index q, fa::Index kv) {
                                return kv <= q && q - kv <= fa::Index(100) + h * fa::Index(300);
                              }};
  const fa::BlockMask heads = fa::create_block_mask(head_band, 1, 3, 1024, 1024);
  ASSERT_EQ(heads.heads(), 3);
  const fa::BlockMask& hl = heads.regrouped_led(192, 128, 128);
  for (int h = 0; h < 3; ++h) {
    const fa::BlockMask one = fa::create_block_mask(
        fa::MaskMod{"one", [h](fa::Index, fa::Index, fa::Index q,
                               fa::Index kv) { return kv <= q && q - kv <= fa::Index(100 + 300 * h); }},
        1, 1, 1024, 1024);
    const fa::BlockMask& ol = one.regrouped_led(192, 128, 128);
    for (int i = 0; i < hl.num_q_blocks(); ++i)
      for (int j = 0; j < hl.num_kv_blocks(); ++j) {
        EXPECT_EQ(hl.kind(0, h, i, j), ol.kind(0, 0, i, j)) << "head " << h << " tile " << i << "," << j;
        const size_t at = (size_t(h) * hl.num_q_blocks() + i) * hl.num_kv_blocks() + j;
        EXPECT_EQ(hl.sub_kinds()[at], ol.sub_kinds()[size_t(i) * ol.num_kv_blocks() + j]) << "head " << h;
      }
  }
}

// Where the persistent Hopper forward's mask starts early (detail::lead_rows): the 192-row tiles
// at Lq % 192 == 64, a host mask whose first query block walks fewer key blocks than its last;
// never on the other tiles and kernels, full masks, masks walking more keys first, given tables.
TEST(MaskAnalysis, LeadRowsPutThePartialBlockWhereTheWalkIsShortest) {
  auto spec = [](fa::KernelFamily family, fa::TileConfig tile, int d) {
    fa::KernelSpec s;
    s.family = family, s.tile = tile, s.head_dim_qk = s.head_dim_v = d;
    return s;
  };
  const fa::KernelSpec three = spec(fa::KernelFamily::kWgmma, {192, 128, 16, 3}, 64),
                       two = spec(fa::KernelFamily::kWgmma, {128, 128, 12, 2}, 128),
                       one_block = spec(fa::KernelFamily::kWgmma, {128, 128, 12, 3}, 128),
                       mma = spec(fa::KernelFamily::kMmaSync, {128, 64, 4, 2}, 64);
  ASSERT_TRUE(fa::sm90_forward_persistent(three));
  ASSERT_TRUE(fa::sm90_forward_persistent(two));
  ASSERT_FALSE(fa::sm90_forward_persistent(one_block));
  auto causal = [](int64_t len) { return fa::create_block_mask(fa::mods::causal(), 1, 1, len, len); };
  const fa::MaskMod anti{"anti", [](fa::Index, fa::Index, fa::Index q, fa::Index kv) { return kv >= q; }};
  EXPECT_EQ(fa::detail::lead_rows(three, causal(4096)), 128);  // 4096 = 21 * 192 + 64
  EXPECT_EQ(fa::detail::lead_rows(three, causal(448)), 128);
  EXPECT_EQ(fa::detail::lead_rows(three, causal(8192)), 0);  // 42 * 192 + 128: two live warpgroups
  EXPECT_EQ(fa::detail::lead_rows(three, causal(4032)), 0);  // 21 * 192
  EXPECT_EQ(fa::detail::lead_rows(three, causal(4000)), 0);  // not a multiple of 64
  EXPECT_EQ(fa::detail::lead_rows(two, causal(4032)), 0);    // 31 * 128 + 64: 128-row tiles keep 0
  EXPECT_EQ(fa::detail::lead_rows(one_block, causal(4032)), 0);
  EXPECT_EQ(fa::detail::lead_rows(mma, causal(4096)), 0);
  EXPECT_EQ(fa::detail::lead_rows(three, fa::BlockMask::all_full(1, 1, 4096, 4096)), 0);
  EXPECT_EQ(fa::detail::lead_rows(three, fa::create_block_mask(anti, 1, 1, 4096, 4096)), 0);
  const fa::BlockMask given = fa::BlockMask::from_kinds(1, 1, 4096, 4096, causal(4096).kinds());
  EXPECT_EQ(fa::detail::lead_rows(three, given), 0);  // not regroupable
  // forward_mask hands the persistent forward the led regrouping, and its tables the offset.
  const fa::BlockMask m = causal(4096);
  const fa::BlockMask& fm = fa::detail::forward_mask(three, m);
  EXPECT_EQ(&fm, &m.regrouped_led(192, 128, 128));
  EXPECT_EQ(fm.num_q_blocks(), 22);
  EXPECT_EQ(fm.kind(0, 0, 0, 0), fa::BlockKind::kPartial);  // rows 0..63
  EXPECT_EQ(fm.kind(0, 0, 0, 1), fa::BlockKind::kEmpty);
  EXPECT_EQ(fa::detail::forward_mask(three, causal(4032)).q_offset(), 0);
}

// The mask each forward family reads (detail::forward_mask): the wgmma forward always gets kv
// blocks of its BLOCK_N (split whatever the tables, merged only where regroupable), query
// blocks it divides or regrouped ones; the mma.sync forward takes any blocks its tile divides.
TEST(MaskAnalysis, ForwardMaskGivesTheWgmmaForwardOneTileAKvBlock) {
  auto spec = [](fa::KernelFamily family, fa::TileConfig tile) {
    fa::KernelSpec s;
    s.family = family, s.tile = tile;
    return s;
  };
  const fa::KernelSpec wide = spec(fa::KernelFamily::kWgmma, {192, 128, 16, 3}),
                       n64 = spec(fa::KernelFamily::kWgmma, {128, 64, 12, 3}),
                       n128 = spec(fa::KernelFamily::kWgmma, {128, 128, 12, 2}),
                       mma = spec(fa::KernelFamily::kMmaSync, {128, 64, 4, 2});
  std::vector<uint8_t> kinds(8 * 4, uint8_t(fa::BlockKind::kFull));
  kinds[1] = uint8_t(fa::BlockKind::kEmpty), kinds[6] = uint8_t(fa::BlockKind::kPartial);
  const fa::BlockMask given = fa::BlockMask::from_kinds(1, 1, 1000, 1000, kinds, 128, 256);
  fa::BlockMask matching = fa::BlockMask::from_kinds(1, 1, 1000, 1000, kinds, 128, 256);
  matching.set_matches_mask_mod();
  auto blocks = [](const fa::BlockMask& m) { return std::pair{m.q_block(), m.kv_block()}; };

  EXPECT_EQ(blocks(fa::detail::forward_mask(n128, given)), std::pair(128, 128));  // split
  EXPECT_EQ(blocks(fa::detail::forward_mask(n64, given)), std::pair(128, 64));
  EXPECT_EQ(blocks(fa::detail::forward_mask(wide, matching)), std::pair(192, 128));  // merged q, split kv
  EXPECT_FALSE(fa::detail::forward_mask(wide, matching).sub_kinds().empty());
  EXPECT_EQ(&fa::detail::forward_mask(mma, given), &given);  // mma.sync walks 4 tiles a block
  const fa::BlockMask own = fa::BlockMask::from_kinds(1, 1, 1000, 1000, std::vector<uint8_t>(8 * 8, 2));
  EXPECT_EQ(&fa::detail::forward_mask(n128, own), &own);
  // Merging given tables into 192-row blocks is refused (Kernel::forward runs a 128x128 twin).
  EXPECT_EQ(fa::test::error_of([&] { fa::detail::forward_mask(wide, given); }),
            "block mask: its 128x256 blocks can be regrouped into 192x128 only when the tables agree with "
            "mask_mod (a mask built by Kernel::block_mask or create_block_mask) or hold one kind of tile; "
            "given tables, build them with blocks 192x128");
}
