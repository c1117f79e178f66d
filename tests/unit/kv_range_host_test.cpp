// Interval masks (codegen's kMaskKvRange) checked by running the generated code on the host: for
// each mask, the FaMods codegen emits is compiled with the host compiler against the embedded
// modlib.cuh (a stub prelude stands in for the device intrinsics it reaches), and
// mask_kv_range's bounds are compared with mask_mod itself over rows and keys near 0, 2^30 and
// 2^31 - 2, batch and head 0 and 1, and captured scalars and buffer values at int32's ends. The
// masks: the presets, hand-written forms, and random and/or/not trees of compares of kv, kv - q
// or q - kv with kv-free values (wrapping sums and products, min, max, loads by b, h and q, int32's
// ends), beside booleans of the row and compares codegen must refuse (!=, two-sided unions).
// mask_mod is the plain translation every GPU test checks against the float64 reference; this
// pins the interval form to it exactly, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fajit/detail/codegen.h"
#include "fajit/detail/expr.h"
#include "fajit/frontend.h"
#include "host_mods.h"

namespace {

// Random masks in the CLI's expression syntax (fa::parse_mask_mod), from a seeded generator.
struct MaskGen {
  std::mt19937 rng;
  explicit MaskGen(unsigned seed) : rng(seed) {}
  int pick(int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); }
  template <size_t N>
  const char* one_of(const char* const (&xs)[N]) {
    return xs[pick(static_cast<int>(N))];
  }
  // A value that does not read kv.
  std::string free(int d = 0) {
    static const char* const kEnds[] = {
        "0", "1", "-1", "7", "(-2147483647 - 1)", "2147483647", "2147483646", "-2147483647", "65536"};
    switch (pick(d < 2 ? 12 : 6)) {
      case 0: return "q";
      case 1: return fmt::format("w{}", pick(3));
      case 2: return one_of(kEnds);
      case 3: return pick(2) ? "b" : "h";
      case 4: return "ids[b, h]";
      case 5: return "ids[b, q % 64]";
      case 6: return fmt::format("({} + {})", free(d + 1), free(d + 1));
      case 7: return fmt::format("({} - {})", free(d + 1), free(d + 1));
      case 8: return fmt::format("({} * {})", free(d + 1), free(d + 1));
      case 9: return fmt::format("min({}, {})", free(d + 1), free(d + 1));
      case 10: return fmt::format("max({}, {})", free(d + 1), free(d + 1));
      default: return fmt::format("-{}", free(d + 1));
    }
  }
  std::string leaf() {
    static const char* const kSides[] = {"kv", "(kv - q)", "(q - kv)"};
    static const char* const kOps[] = {"<", "<=", ">", ">=", "==", "!="};
    const std::string side = one_of(kSides), op = one_of(kOps), x = free();
    return pick(2) ? fmt::format("({} {} {})", side, op, x) : fmt::format("({} {} {})", x, op, side);
  }
  std::string tree(int d = 0) {
    static const char* const kOps[] = {"<", "<=", ">", ">=", "==", "!="};
    const int c = pick(10);
    std::string t = d > 3 || c < 4 ? leaf()
                    : c < 5        ? fmt::format("({} {} {})", free(), one_of(kOps), free())
                            : fmt::format("({} {} {})", tree(d + 1), pick(2) ? "&&" : "||", tree(d + 1));
    return pick(100) < 35 ? "!" + t : t;
  }
};

// The harness: for mask struct M, mask_kv_range against mask_mod over the grid; prints
// "MISMATCH ..." for the first few, then "checked N bad K".
constexpr const char* kHarness = R"(
static int g_ids[64][64];
static const int kExt[] = {-2147483647 - 1, -2147483647, -2147483642, -65536, -100, -3, -1, 0, 1, 2, 3, 17,
                           100, 65536, 1 << 30, 2147483642, 2147483646, 2147483647};
static std::vector<int> grid() {
  std::vector<int> v;
  for (int i = 0; i < 24; ++i) v.push_back(i);
  for (int c : {100, 1000, 65536, 1 << 30})
    for (int d = -2; d <= 2; ++d) v.push_back(c + d);
  for (int d = 2; d <= 9; ++d) v.push_back(2147483647 - d);
  return v;
}
template <typename M>
static long long check(const char* name, unsigned seed, long long* checked) {
  static const std::vector<int> idx = grid();
  FaCaptures cap{};
  for (int i = 0; i < FA_MAX_BUFFERS; ++i) cap.buffers[i].ptr = g_ids, cap.buffers[i].stride[0] = 64,
                                          cap.buffers[i].stride[1] = 1;
  unsigned x = seed;
  auto next = [&] { x = x * 1664525u + 1013904223u; return x >> 8; };
  long long bad = 0;
  for (int combo = 0; combo < 24; ++combo) {
    for (int s = 0; s < 4; ++s) cap.scalars[s].i = kExt[next() % (sizeof kExt / sizeof *kExt)];
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h)
        for (int q : idx) {
          int lo, hi;
          M::mask_kv_range(b, h, q, cap, lo, hi);
          for (int kv : idx) {
            const bool want = M::mask_mod(b, h, q, kv, cap), got = lo <= kv && kv <= hi;
            ++*checked;
            if (want != got && bad++ < 3)
              std::printf("MISMATCH %s b=%d h=%d q=%d kv=%d w=%d,%d,%d: mask_mod %d, bounds [%d, %d]\n", name, b, h,
                          q, kv, cap.scalars[0].i, cap.scalars[1].i, cap.scalars[2].i, want, lo, hi);
          }
        }
  }
  return bad;
}
)";

TEST(KvRangeHost, BoundsEqualTheMaskEverywhere) {
  fa::ExprCaptureTypes types;
  for (const char* w : {"w0", "w1", "w2", "ids"}) types.types[w] = false;  // i32
  std::vector<std::string> masks = {
      "q >= kv", "q >= kv && q - kv <= w0", "kv < w0 || q >= kv", "q >= w0 && kv >= w0", "q + w0 >= kv",
      "kv < ids[b, h]", "kv <= ids[b, h] || kv < w0", "kv == q", "!(kv != q)", "!(kv > q || q - kv > 100)",
      "kv - q >= -7 && kv - q <= 7", "q - kv >= w0 && q - kv <= w1", "kv >= q * 2", "kv <= q + 2147483647",
      "(kv < w0 || kv < w1) && (q >= 3 || h == 1)", "!(q < 5) && kv > q - w2",
      // not intervals (codegen must refuse them): != and two-sided unions
      "kv != q", "kv < w0 || kv > w1", "(kv >= q && kv <= q + 5) || kv < 3", "!(kv >= w0 && kv < w1)"};
  const size_t fixed = masks.size();
  MaskGen gen(20261128);
  for (int i = 0; i < 260; ++i) masks.push_back(gen.tree());

  std::ostringstream tu, calls;
  int recognised = 0, recognised_random = 0;
  for (size_t i = 0; i < masks.size(); ++i) {
    const std::string src =
        fa::emit_mods(fa::trace(fa::identity_score(), fa::parse_mask_mod(masks[i], types)));
    if (src.find("kMaskKvRange = true") == std::string::npos) continue;
    ++recognised, recognised_random += i >= fixed;
    const std::string mods = fa_test::mods_struct(src, fmt::format("Mods{}", i));
    ASSERT_FALSE(mods.empty()) << src;
    tu << mods;
    std::string quoted = masks[i];
    std::replace(quoted.begin(), quoted.end(), '"', '\'');
    calls << fmt::format("  bad += check<Mods{}>(\"{}\", {}u, &checked);\n", i, quoted, 7919u * (i + 1));
  }
  // The presets and hand-written forms that are intervals are found; the refused ones are not.
  for (size_t i = 0; i < fixed; ++i) {
    const std::string src =
        fa::emit_mods(fa::trace(fa::identity_score(), fa::parse_mask_mod(masks[i], types)));
    EXPECT_EQ(src.find("kMaskKvRange = true") != std::string::npos, i < fixed - 4) << masks[i];
  }
  EXPECT_GE(recognised_random, 80) << "the generator should make many interval masks";

  const fa_test::HostRun r = fa_test::run_on_host(
      "fajit-kv-range",
      tu.str() + kHarness +
          "int main() {\n  for (int i = 0; i < 64; ++i) for (int j = 0; j < 64; ++j)\n"
          "    g_ids[i][j] = kExt[(i * 7 + j * 13) % (sizeof kExt / sizeof *kExt)];\n"
          "  long long bad = 0, checked = 0;\n" +
          calls.str() +
          "  std::printf(\"checked %lld bad %lld\\n\", checked, bad);\n  return bad != 0;\n}\n");
  ASSERT_TRUE(r.compiled) << r.command << "\n" << r.compile_log.substr(0, 4000);
  EXPECT_EQ(r.rc, 0) << r.output.substr(0, 4000);
  EXPECT_NE(r.output.find(" bad 0\n"), std::string::npos) << r.output.substr(0, 4000);
  std::printf("%d masks recognised (%d random), %s", recognised, recognised_random, r.output.c_str());
  if (r.rc == 0) r.remove();
}

}  // namespace
