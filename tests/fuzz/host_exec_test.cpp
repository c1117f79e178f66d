// The mods codegen emits, run without a GPU: for the fuzzer's random cases (every op of the
// verifier's table, frontend-traced and MLIR-text cases, kv-linear score_mods and interval
// masks), the FaMods struct codegen emits is compiled with the host compiler against the
// embedded modlib.cuh (tests/common/host_mods.h: a stub prelude stands in for the device
// intrinsics, the host's libm for expf / logf / ...),
// run at random points with each case's captured buffers and scalars filled into FaCaptures by
// the codegen's own slots, and compared with the interpreter (the semantics the float64
// reference and every GPU test check the kernels against). Masks must agree exactly; scores
// within the fuzzer's float tolerance (the host libm against the interpreter's constant folding)
// and NaN / inf exactly. A wrong translation in codegen (an operator, a conversion, a NaN rule,
// a capture slot) fails here in CI, before a GPU runs it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fajit/detail/codegen.h"
#include "fajit/detail/interp.h"
#include "fajit/kernel_spec.h"
#include "fuzz.h"
#include "host_mods.h"

namespace {

// Runs Mods over n points (b, h, q, kv, score bits): prints "score-bits mask" a line.
constexpr const char* kHarness = R"(
template <typename M>
static void run(const FaCaptures& cap, const int (*pts)[4], const unsigned* scores, int n) {
  for (int i = 0; i < n; ++i) {
    float s;
    std::memcpy(&s, &scores[i], 4);
    const float v = M::score_mod(s, pts[i][0], pts[i][1], pts[i][2], pts[i][3], cap);
    const bool m = M::mask_mod(pts[i][0], pts[i][1], pts[i][2], pts[i][3], cap);
    unsigned bits;
    std::memcpy(&bits, &v, 4);
    std::printf("%08x %d\n", bits, m ? 1 : 0);
  }
}
)";

// The backward's hook over the same points (dt per point): prints dS bits a line, then the
// gradient buffers' elements (bits) the grad_adds accumulated, `nbufs` buffers of sizes[i].
constexpr const char* kGradHarness = R"(
template <typename M>
static void run_grad(const FaCaptures& cap, const FaGradBuffers& grads, const int (*pts)[4],
                     const unsigned* scores, const unsigned* dts, int n, float* const* bufs, const int* sizes,
                     int nbufs) {
  for (int i = 0; i < n; ++i) {
    float s, dt;
    std::memcpy(&s, &scores[i], 4);
    std::memcpy(&dt, &dts[i], 4);
    const float ds = M::score_grad(s, pts[i][0], pts[i][1], pts[i][2], pts[i][3], dt, cap, grads);
    unsigned bits;
    std::memcpy(&bits, &ds, 4);
    std::printf("%08x\n", bits);
  }
  for (int j = 0; j < nbufs; ++j)
    for (int e = 0; e < sizes[j]; ++e) {
      unsigned bits;
      std::memcpy(&bits, &bufs[j][e], 4);
      std::printf("%08x\n", bits);
    }
}
)";

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Sample {
  fa_fuzz::Point p;
  float score;
  float dt = 0;
};

TEST(HostExec, EmittedModsEqualTheInterpreter) {
  constexpr uint64_t kSeed = 20261129;
  constexpr int kCases = 1000, kPoints = 64;
  std::ostringstream tu, calls;
  std::vector<fa_fuzz::Case> cases;
  std::vector<std::vector<Sample>> samples;
  std::vector<bool> differentiable;
  std::vector<std::vector<std::pair<std::string, size_t>>> grad_buffers;
  std::mt19937_64 rng(kSeed);
  int text_cases = 0, grad_cases = 0;
  for (int k = 0; k < kCases; ++k) {
    fa_fuzz::Case c = fa_fuzz::generate_case(kSeed, k, k % 2 == 1, k % 3 == 1);
    fa::Program p = fa_fuzz::program_of(c);
    text_cases += c.text;
    // The backward's score_grad too where the score_mod has a derivative.
    bool with_grad = true;
    try {
      (void)p.score_grad_mlir();
    } catch (const fa::Error&) {
      with_grad = false;
    }
    grad_cases += with_grad;
    differentiable.push_back(with_grad);
    const std::string src = fa::emit_mods(p, with_grad);
    const std::string mods = fa_test::mods_struct(src, fmt::format("Mods{}", k));
    ASSERT_FALSE(mods.empty()) << src;
    tu << mods;
    // The case's captures, in the slots codegen gave them; buffers contiguous, as bits.
    std::ostringstream fill, grad_fill;
    std::vector<std::string> grad_arrays, grad_sizes;
    std::vector<std::pair<std::string, size_t>> grad_bufs;  // (name, elements), in the order printed
    for (const fa::CaptureSlot& s : fa::capture_slots(p)) {
      if (s.is_buffer) {
        const fa_fuzz::BufferSpec* b = nullptr;
        for (const auto& x : c.buffers) b = x.name == s.name ? &x : b;
        ASSERT_NE(b, nullptr) << s.name;
        // Contiguous strides, set for the buffer in `what` (cap, grads).
        auto strides = [&](const char* what) {
          std::string out;
          int64_t stride = 1;
          for (int d = static_cast<int>(b->shape.size()) - 1; d >= 0; --d) {
            out += fmt::format("  {}.buffers[{}].stride[{}] = {};\n", what, s.slot, d, stride);
            stride *= b->shape[d];
          }
          return out;
        };
        if (with_grad && b->is_float) {  // a gradient buffer beside it, zeroed, same layout
          const size_t elems = b->f.size();
          tu << fmt::format("static float grad{}_{}[{}];\n", k, s.slot, elems);
          grad_fill << fmt::format("  grads.buffers[{}].ptr = grad{}_{};\n", s.slot, k, s.slot)
                    << strides("grads");
          grad_arrays.push_back(fmt::format("grad{}_{}", k, s.slot));
          grad_sizes.push_back(std::to_string(elems));
          grad_bufs.emplace_back(s.name, elems);
        }
        std::vector<uint32_t> bits;
        if (b->is_float)
          for (float f : b->f) bits.push_back(bits_of(f));
        else
          for (int32_t i : b->i) bits.push_back(static_cast<uint32_t>(i));
        tu << fmt::format("static const unsigned buf{}_{}[] = {{{:#x}}};\n", k, s.slot,
                          fmt::join(bits, ", "));
        fill << fmt::format("  cap.buffers[{}].ptr = buf{}_{};\n", s.slot, k, s.slot) << strides("cap");
      } else {
        const fa_fuzz::ScalarSpec* v = nullptr;
        for (const auto& x : c.scalars) v = x.name == s.name ? &x : v;
        ASSERT_NE(v, nullptr) << s.name;
        if (s.is_float)
          fill << fmt::format("  cap.scalars[{}].i = (int){:#x};\n", s.slot,
                              bits_of(static_cast<float>(v->value)));
        else
          fill << fmt::format("  cap.scalars[{}].i = {};\n", s.slot, static_cast<int32_t>(v->value));
      }
    }
    // Points in the case's small shape (every buffer index in range there), scores mostly
    // moderate, some special.
    std::vector<Sample> pts;
    std::vector<std::string> pt_text, score_text, dt_text;
    for (int i = 0; i < kPoints; ++i) {
      auto u = [&](int n) { return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng)); };
      const fa_fuzz::Shape& sh = c.small;
      Sample smp{{u(sh.batch), u(sh.heads_q), u(sh.len_q), u(sh.len_kv)}, 0.0f};
      static const float kSpecial[] = {0.0f,   -0.0f, 1.0f, -1.0f,    50.0f,
                                       -50.0f, 1e-6f, 0.5f, INFINITY, -INFINITY};
      smp.score =
          u(8) == 0 ? kSpecial[u(10)] : static_cast<float>(std::normal_distribution<double>(0, 3)(rng));
      smp.dt = static_cast<float>(std::normal_distribution<double>(0, 1)(rng));
      pt_text.push_back(fmt::format("{{{}, {}, {}, {}}}", smp.p.b, smp.p.h, smp.p.q, smp.p.kv));
      score_text.push_back(fmt::format("{:#x}", bits_of(smp.score)));
      dt_text.push_back(fmt::format("{:#x}", bits_of(smp.dt)));
      pts.push_back(smp);
    }
    tu << fmt::format("static const int pts{}[][4] = {{{}}};\nstatic const unsigned scores{}[] = {{{}}};\n",
                      k, fmt::join(pt_text, ", "), k, fmt::join(score_text, ", "));
    calls << fmt::format("  {{\n  FaCaptures cap{{}};\n{}  run<Mods{}>(cap, pts{}, scores{}, {});\n",
                         fill.str(), k, k, k, kPoints);
    if (with_grad) {
      tu << fmt::format("static const unsigned dts{}[] = {{{}}};\n", k, fmt::join(dt_text, ", "));
      calls << fmt::format(
          "  FaGradBuffers grads{{}};\n{}  float* gb[] = {{{}nullptr}};\n  const int gs[] = {{{}0}};\n"
          "  run_grad<Mods{}>(cap, grads, pts{}, scores{}, dts{}, {}, gb, gs, {});\n",
          grad_fill.str(), grad_arrays.empty() ? "" : fmt::format("{}, ", fmt::join(grad_arrays, ", ")),
          grad_sizes.empty() ? "" : fmt::format("{}, ", fmt::join(grad_sizes, ", ")), k, k, k, k, kPoints,
          grad_arrays.size());
    }
    calls << "  }\n";
    cases.push_back(std::move(c));
    samples.push_back(std::move(pts));
    grad_buffers.push_back(std::move(grad_bufs));
  }
  EXPECT_GE(text_cases, kCases / 10) << "the MLIR-text cases (every op of the table) should be among them";

  const fa_test::HostRun run =
      fa_test::run_on_host("fajit-host-exec", tu.str() + kHarness + kGradHarness + "int main() {\n" +
                                                  calls.str() + "  return 0;\n}\n");
  ASSERT_TRUE(run.compiled) << run.command << "\n" << run.compile_log.substr(0, 4000);
  ASSERT_EQ(run.rc, 0) << run.output.substr(0, 2000);

  std::istringstream log(run.output);
  int compared = 0, nonfinite = 0, failures = 0, grad_compared = 0, ill_conditioned = 0;
  for (int k = 0; k < kCases && failures < 5; ++k) {
    const fa_fuzz::Case& c = cases[k];
    const fa::Program p = fa_fuzz::program_of(c);
    const fa::Bindings env = fa_fuzz::bindings_of(c);
    const fa::BoundMod sb = fa::ModProgram::score_of(p).bind(env), mb = fa::ModProgram::mask_of(p).bind(env);
    std::vector<std::pair<std::string, int>> lines(samples[k].size());  // the case's, read whole
    for (auto& [bits, mask] : lines)
      ASSERT_TRUE(log >> bits >> mask) << "case " << k << ": the harness printed too little";
    std::vector<std::string> grad_lines;
    if (differentiable[k]) {
      size_t n_grad = samples[k].size();
      for (const auto& gb : grad_buffers[k]) n_grad += gb.second;
      grad_lines.resize(n_grad);
      for (std::string& g : grad_lines)
        ASSERT_TRUE(log >> g) << "case " << k << ": the harness printed too few gradient lines";
    }
    for (size_t i = 0; i < samples[k].size(); ++i) {
      const Sample& s = samples[k][i];
      const auto& [bits, mask] = lines[i];
      const float host = float_of(static_cast<uint32_t>(std::stoul(bits, nullptr, 16)));
      const float want = sb.score(s.score, s.p.b, s.p.h, s.p.q, s.p.kv);
      const bool want_mask = mb.mask(s.p.b, s.p.h, s.p.q, s.p.kv);
      ++compared;
      nonfinite += !std::isfinite(want);
      if (fa_fuzz::same_float(host, want) && mask == int(want_mask)) continue;
      ADD_FAILURE() << fmt::format(
          "case {} (seed {}) at score={} b={} h={} q={} kv={}: emitted code gives score {} mask {}, the "
          "interpreter {} / {}\n{}",
          k, kSeed, s.score, s.p.b, s.p.h, s.p.q, s.p.kv, host, mask, want, int(want_mask),
          fa_fuzz::describe(c));
      ++failures;
      break;
    }
    if (!differentiable[k] || failures) continue;
    // The backward's hook: dS at every point, then each buffer's accumulated gradient, against the
    // interpreter's score_grad with its grad_adds summed in the same order (fp32, as red_add).
    const fa::BoundMod gbm = fa::ModProgram::grad_of(p).bind(env);
    std::map<std::string, std::vector<float>> acc;
    for (const auto& [name, elems] : grad_buffers[k]) acc[name].assign(elems, 0.0f);
    std::map<std::string, std::vector<int64_t>> strides;
    for (const auto& b : c.buffers) {
      std::vector<int64_t> st(b.shape.size(), 1);
      for (int d = static_cast<int>(b.shape.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * b.shape[d + 1];
      strides[b.name] = st;
    }
    const fa::GradSink sink = [&](const fa::GradAdd& g) {
      auto it = acc.find(g.capture);
      if (it == acc.end() || g.value == 0.0f) return;
      int64_t at = 0;
      for (int d = 0; d < g.rank; ++d) at += int64_t(g.index[d]) * strides[g.capture][d];
      it->second[static_cast<size_t>(at)] += g.value;
    };
    size_t line = 0;
    for (const Sample& s : samples[k]) {
      const float host = float_of(static_cast<uint32_t>(std::stoul(grad_lines[line++], nullptr, 16)));
      const float want = gbm.score_grad(s.score, s.p.b, s.p.h, s.p.q, s.p.kv, s.dt, sink);
      ++grad_compared;
      if (fa_fuzz::same_float(host, want)) continue;
      // Ill-conditioned where the derivative moves by more than the tolerance within a few ulps
      // of the score (cos of a product near 300: the kernels' divf, within 1.5 ulp, and the
      // interpreter's division may differ there): such a point is not compared.
      const float up = gbm.score_grad(std::nextafter(std::nextafter(s.score, INFINITY), INFINITY), s.p.b,
                                      s.p.h, s.p.q, s.p.kv, s.dt),
                  down = gbm.score_grad(std::nextafter(std::nextafter(s.score, -INFINITY), -INFINITY), s.p.b,
                                        s.p.h, s.p.q, s.p.kv, s.dt);
      if (!fa_fuzz::same_float(up, want) || !fa_fuzz::same_float(down, want)) {
        ++ill_conditioned;
        continue;
      }
      ADD_FAILURE() << fmt::format(
          "case {} (seed {}) score_grad at score={} dt={} b={} h={} q={} kv={}: emitted code gives {}, the "
          "interpreter {}\n{}",
          k, kSeed, s.score, s.dt, s.p.b, s.p.h, s.p.q, s.p.kv, host, want, fa_fuzz::describe(c));
      ++failures;
      break;
    }
    if (failures) continue;
    for (const auto& [name, elems] : grad_buffers[k])
      for (size_t e = 0; e < elems; ++e) {
        const float host = float_of(static_cast<uint32_t>(std::stoul(grad_lines[line++], nullptr, 16)));
        const float want = acc[name][e];
        if (fa_fuzz::same_float(host, want)) continue;
        ADD_FAILURE() << fmt::format(
            "case {} (seed {}): gradient of buffer '{}' element {}: emitted code accumulates {}, the "
            "interpreter {}\n{}",
            k, kSeed, name, e, host, want, fa_fuzz::describe(c));
        ++failures;
        break;
      }
  }
  std::printf(
      "%d cases (%d MLIR text, %d with a score_grad), %d points compared (%d of score_grad, %d of them "
      "ill-conditioned), %d non-finite scores\n",
      kCases, text_cases, grad_cases, compared, grad_compared, ill_conditioned, nonfinite);
  EXPECT_GE(grad_cases, kCases / 4) << "many cases should have a derivative";
  if (!HasFailure()) run.remove();
}

}  // namespace
