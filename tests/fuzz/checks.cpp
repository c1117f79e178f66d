// The fuzzer's CPU checks and driver (fuzz.h; what each check does: tests/fuzz/README.md).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <ostream>
#include <sstream>

#include <fmt/format.h>

#include "fajit/captures.h"
#include "fajit/detail/codegen.h"
#include "fajit/detail/mask_analysis.h"
#include "fajit/detail/reference.h"
#include "fajit/jit/nvrtc.h"
#include "fuzz.h"

namespace fa_fuzz {

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  // Constant folding may round a transcendental differently from the host's float libm.
  return std::fabs(a - b) <= 1e-4f * std::max({1.0f, std::fabs(a), std::fabs(b)});
}

namespace {

// Thrown by a check: the failure text.
struct Failure {
  std::string what;
};
[[noreturn]] void fail(std::string what) { throw Failure{std::move(what)}; }

// A random score: mostly moderate, sometimes special.
float random_score(std::mt19937_64& rng) {
  static const float kSpecial[] = {0.0f, -0.0f, 1.0f, -1.0f, 50.0f, -50.0f, 1e-6f, 0.5f};
  std::uniform_int_distribution<int> pick(0, 9);
  int k = pick(rng);
  if (k < 2) return kSpecial[std::uniform_int_distribution<int>(0, 7)(rng)];
  return static_cast<float>(std::normal_distribution<double>(0, 3)(rng));
}

Point random_point(std::mt19937_64& rng, const Shape& s) {
  auto u = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  return {u(s.batch), u(s.heads_q), u(s.len_q), u(s.len_kv)};
}

fa::Captures captures_of(const Case& c) {
  fa::Captures cap;
  for (const ScalarSpec& s : c.scalars) {
    if (s.is_float)
      cap.scalar(s.name, static_cast<float>(s.value));
    else
      cap.scalar(s.name, static_cast<int32_t>(s.value));
  }
  return cap;
}

// Is `n` (transitively) fed by the score or an f32 buffer: the differentiation pass's "active".
bool active(const NodeP& n) {
  if (n->op == Op::kScoreArg || n->op == Op::kLoadF) return true;
  for (const NodeP& k : n->kids)
    if (active(k)) return true;
  return false;
}
// An active floor / ceil / remf / fptosi / fptoui: the ops the pass may refuse (README).
bool has_refusable(const NodeP& n) {
  if ((n->op == Op::kFloor || n->op == Op::kCeil || n->op == Op::kRemF || n->op == Op::kFToI ||
       n->op == Op::kFToUI) &&
      active(n))
    return true;
  for (const NodeP& k : n->kids)
    if (has_refusable(k)) return true;
  return false;
}

// 1. The traced program: round-trips through the printer and parser unchanged.
void check_roundtrip(const fa::Program& p) {
  std::string text = p.to_mlir();
  fa::Program again = fa::Program::parse(text, "fuzz");
  std::string back = again.to_mlir();
  if (back == text) return;
  std::istringstream x(text), y(back);
  std::string lx, ly;
  int line = 1;
  while (std::getline(x, lx) && std::getline(y, ly) && lx == ly) ++line;
  fail(
      fmt::format("print -> parse -> print changed the module at line {}:\n  printed:  {}\n  reparsed: {}\n"
                  "reparsed module:\n{}",
                  line, lx, ly, back));
}

// 2. The simplified program, interpreted, equals the generated graph evaluated directly.
void check_interp(const Case& c, const fa::Program& p, const fa::Bindings& env, std::mt19937_64& rng,
                  Stats& st) {
  fa::ModProgram sp = fa::ModProgram::score_of(p), mp = fa::ModProgram::mask_of(p);
  fa::BoundMod sb = sp.bind(env), mb = mp.bind(env);
  for (int i = 0; i < 64; ++i) {
    Point pt = random_point(rng, i % 2 ? c.shape : c.small);
    float s = random_score(rng);
    bool m_ir = mb.mask(pt.b, pt.h, pt.q, pt.kv), m_tree = eval_mask(c, pt);
    if (m_ir != m_tree)
      fail(fmt::format("mask_mod at (b={}, h={}, q={}, kv={}): interpreter {} but the graph gives {}", pt.b,
                       pt.h, pt.q, pt.kv, m_ir, m_tree));
    float v_ir = sb.score(s, pt.b, pt.h, pt.q, pt.kv);
    float v_tree = eval_score<float>(c, c.score, s, pt);
    ++st.points;
    st.nonfinite_scores += !std::isfinite(v_ir);
    if (!same_float(v_ir, v_tree))
      fail(fmt::format(
          "score_mod at (score={}, b={}, h={}, q={}, kv={}): interpreter {} but the graph gives {}", s, pt.b,
          pt.h, pt.q, pt.kv, v_ir, v_tree));
  }
}

// 3. Block classification: the symbolic analysis never contradicts brute force; on the small
// shape every block is compared, on the run's shape random decided blocks are.
void check_mask_analysis(const Case& c, const fa::Program& p, const fa::Bindings& env, std::mt19937_64& rng,
                         Stats& st) {
  fa::ModProgram mp = fa::ModProgram::mask_of(p);
  fa::Captures cap = captures_of(c);
  const int blocks[] = {64, 128};
  int qb = blocks[rng() % 2], kb = blocks[rng() % 2];
  const Shape& s = c.small;
  fa::MaskAnalysis a = fa::analyze_block_mask(p, s.batch, s.heads_q, s.len_q, s.len_kv, qb, kb, cap);
  std::vector<uint8_t> brute =
      fa::brute_force_block_classes(mp, env, s.batch, s.heads_q, s.len_q, s.len_kv, qb, kb);
  int nq = (s.len_q + qb - 1) / qb, nk = (s.len_kv + kb - 1) / kb;
  if (a.num_q_blocks != nq || a.num_kv_blocks != nk)
    fail(fmt::format("analysis grid {}x{}, expected {}x{}", a.num_q_blocks, a.num_kv_blocks, nq, nk));
  auto compare = [&](const char* stage) {
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < s.heads_q; ++h)
        for (int i = 0; i < nq; ++i)
          for (int j = 0; j < nk; ++j) {
            int ab = a.batch == 1 ? 0 : b, ah = a.heads == 1 ? 0 : h;
            uint8_t k = a.kinds[((size_t(ab) * a.heads + ah) * nq + i) * nk + j];
            uint8_t want = brute[((size_t(b) * s.heads_q + h) * nq + i) * nk + j];
            if (k == fa::kUndecidedBlock) continue;
            if (k != want)
              fail(fmt::format(
                  "{}: block (b={}, h={}, qblock={}, kvblock={}) of {}x{} blocks is {} but brute force "
                  "says {} (analysis tables B={} H={})",
                  stage, b, h, i, j, qb, kb, k, want, a.batch, a.heads));
          }
  };
  compare("mask analysis");
  st.blocks += static_cast<int64_t>(a.kinds.size());
  st.undecided += a.undecided;
  fa::evaluate_undecided_blocks(a, mp, env, s.len_q, s.len_kv, qb, kb);
  compare("evaluate_undecided_blocks");
  for (uint8_t k : a.kinds)
    if (k == fa::kUndecidedBlock) fail("evaluate_undecided_blocks left an undecided block");

  // The run's shape (lengths up to 5000): the analysis, spot-checked on random blocks.
  const Shape& r = c.shape;
  fa::MaskAnalysis big = fa::analyze_block_mask(p, r.batch, r.heads_q, r.len_q, r.len_kv, 128, 128, cap);
  fa::BoundMod bm = mp.bind(env);
  for (int t = 0; t < 6; ++t) {
    Point pt = random_point(rng, r);
    int i = pt.q / 128, j = pt.kv / 128;
    int ab = big.batch == 1 ? 0 : pt.b, ah = big.heads == 1 ? 0 : pt.h;
    uint8_t k = big.kinds[((size_t(ab) * big.heads + ah) * big.num_q_blocks + i) * big.num_kv_blocks + j];
    if (k == fa::kUndecidedBlock) continue;
    auto want = static_cast<uint8_t>(
        fa::detail::brute_force_block_kind(bm, pt.b, pt.h, i * 128, std::min(r.len_q, i * 128 + 128), j * 128,
                                           std::min(r.len_kv, j * 128 + 128)));
    if (k != want)
      fail(fmt::format(
          "mask analysis on the run's shape: block (b={}, h={}, qblock={}, kvblock={}) is {} but brute "
          "force says {}",
          pt.b, pt.h, i, j, k, want));
  }
}

// 4. The derivative (fa-differentiate), interpreted, against central finite differences of the
// graph evaluated in double (its parts free of the variable in f32, as the kernel has them:
// eval_score's f32_invariants), at random points. A point is skipped only by the rule in the README
// (the stencil crosses a kink or is not finite or does not converge).
void check_derivative(const Case& c, const fa::Program& p, const fa::Bindings& env, std::mt19937_64& rng,
                      Stats& st, bool* has_grad) {
  std::optional<fa::ModProgram> gp;
  try {
    gp = fa::ModProgram::grad_of(p);
  } catch (const fa::Error& e) {
    *has_grad = false;
    ++st.no_derivative;
    if (!has_refusable(c.score))
      fail(std::string("the differentiation pass refused a score_mod with no active "
                       "floor/ceil/remf/fptosi/fptoui:\n") +
           e.what());
    return;
  }
  *has_grad = true;
  fa::ModProgram sp = fa::ModProgram::score_of(p);
  fa::BoundMod gb = gp->bind(env), sb = sp.bind(env);
  using Perturb = std::map<std::pair<std::string, int64_t>, double>;
  // f(x + t) - f(x - t) with x the score or one buffer element, in double (the rest in f32);
  // the kink rule.
  auto fd = [&](const Point& pt, float s, const std::string& buf, int64_t elem, double x0, double t,
                const std::vector<int64_t>& br_float, double* out) {
    std::vector<int64_t> b0, bp, bm;
    Perturb pp, pm;
    double sp_ = s, sm_ = s;
    if (buf.empty()) {
      sp_ = s + t;
      sm_ = s - t;
    } else {
      pp[{buf, elem}] = t;
      pm[{buf, elem}] = -t;
    }
    Perturb p0;  // a move of 0, so f0 keeps the same parts in f32 as fp and fm
    if (!buf.empty()) p0[{buf, elem}] = 0;
    double f0 =
        eval_score<double>(c, c.score, double(s), pt, &b0, buf.empty() ? nullptr : &p0, nullptr, true);
    double fp = eval_score<double>(c, c.score, sp_, pt, &bp, buf.empty() ? nullptr : &pp, nullptr, true);
    double fm = eval_score<double>(c, c.score, sm_, pt, &bm, buf.empty() ? nullptr : &pm, nullptr, true);
    (void)x0;
    if (b0 != bp || b0 != bm || b0 != br_float) return false;
    if (!std::isfinite(f0) || !std::isfinite(fp) || !std::isfinite(fm)) return false;
    *out = (fp - fm) / (2 * t);
    // Below double's resolution at this magnitude (score + 1e24 moves by 0 for t = 1e-3).
    if (std::max({std::fabs(f0), std::fabs(fp), std::fabs(fm)}) * 1e-15 / t >
        1e-4 * std::max(1.0, std::fabs(*out)))
      return false;
    return true;
  };
  // `mag`: the largest |intermediate| of the forward evaluation. The f32 adjoints sum terms of
  // about that size that may cancel, so the tolerance has an absolute part 1e-6 * mag.
  auto compare = [&](const Point& pt, float s, const std::string& buf, int64_t elem, double x0, double got,
                     const std::vector<int64_t>& br_float, double mag, double noise) {
    // Three steps, each quotient within 1e-3 of the next: two can agree by accident where the
    // function oscillates faster than the stencil (sin(2513·s) at s = 50: 2513·t is 40π at
    // t = 0.05 and 10π at t / 4, both quotients near 0; the replay seed 4110 case 20604).
    double t = 1e-3 * std::max(1.0, std::fabs(x0)), d1 = 0, d2 = 0, d3 = 0;
    auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-3 * std::max(1.0, std::fabs(b)); };
    if (!std::isfinite(got) || !fd(pt, s, buf, elem, x0, t, br_float, &d1) ||
        !fd(pt, s, buf, elem, x0, t / 4, br_float, &d2) || !fd(pt, s, buf, elem, x0, t / 16, br_float, &d3) ||
        !near(d1, d2) || !near(d2, d3)) {
      ++st.fd_skipped;
      return;
    }
    ++st.fd_checked;
    if (std::fabs(got - d2) > 1e-2 * std::max(1.0, std::fabs(d2)) + 1e-6 * mag + 4 * noise)
      fail(fmt::format(
          "derivative {} at (score={}, b={}, h={}, q={}, kv={}): fa.score_grad gives {} but central "
          "differences give {}",
          buf.empty() ? "d/dscore" : fmt::format("d/d{}[{}]", buf, elem), s, pt.b, pt.h, pt.q, pt.kv, got,
          d2));
  };
  for (int i = 0; i < 24; ++i) {
    Point pt = random_point(rng, i % 2 ? c.shape : c.small);
    float s = random_score(rng);
    std::vector<int64_t> br_float;
    double mag = 0;
    float v = eval_score<float>(c, c.score, s, pt, &br_float, nullptr, &mag);
    if (!std::isfinite(v)) {
      ++st.fd_skipped;
      continue;
    }
    using Adds = std::map<std::pair<std::string, int64_t>, double>;
    auto grad_at = [&](float x, Adds& adds) {
      return gb.score_grad(x, pt.b, pt.h, pt.q, pt.kv, 1.0f, [&](const fa::GradAdd& a) {
        const BufferSpec* b = nullptr;
        for (const BufferSpec& y : c.buffers)
          if (y.name == a.capture) b = &y;
        if (!b) fail("grad_add to unknown capture " + a.capture);
        int64_t flat = 0;
        for (int d = 0; d < a.rank; ++d) flat = flat * b->shape[d] + a.index[d];
        adds[{a.capture, flat}] += a.value;
      });
    };
    Adds adds;
    float g = grad_at(s, adds);
    // The f32 rounding noise of the derivative: its spread over the 3 floats either side of s
    // (the true derivative barely moves over a few ulps; cancelling f32 adjoints jump).
    double noise = 0;
    std::map<std::pair<std::string, int64_t>, double> add_noise;
    float up = s, down = s;
    for (int k = 0; k < 3; ++k) {
      up = std::nextafter(up, INFINITY);
      down = std::nextafter(down, -INFINITY);
      for (float x : {up, down}) {
        Adds other;
        float gx = grad_at(x, other);
        if (std::isfinite(gx)) noise = std::max(noise, std::fabs(double(gx) - g));
        for (const auto& [key, val] : adds)
          if (other.count(key) && std::isfinite(other[key]))
            add_noise[key] = std::max(add_noise[key], std::fabs(other[key] - val));
      }
    }
    (void)sb;
    compare(pt, s, "", 0, s, g, br_float, mag, noise);
    for (const auto& [key, val] : adds) {
      const BufferSpec* b = nullptr;
      for (const BufferSpec& x : c.buffers)
        if (x.name == key.first) b = &x;
      compare(pt, s, key.first, key.second, b->f[key.second], val, br_float, mag, add_noise[key]);
    }
  }
}

fa::KernelSpec spec_of(const Case& c, fa::KernelKind kind) {
  fa::KernelSpec s;
  s.kind = kind;
  s.dtype = c.shape.dtype;
  s.head_dim_qk = c.shape.dim_qk;
  s.head_dim_v = c.shape.dim_v;
  s.arch = c.arch;
  return s;
}

}  // namespace

std::string check_cpu(const Case& c, bool nvrtc, Stats* stats) {
  Stats local;
  Stats& st = stats ? *stats : local;
  std::string stage = "trace";
  try {
    fa::Program p = program_of(c);
    fa::Bindings env = bindings_of(c);
    std::mt19937_64 rng(c.seed ^ (0x5bd1e995ull * (c.index + 1)));
    stage = "round trip";
    check_roundtrip(p);
    stage = "interpreter vs graph";
    check_interp(c, p, env, rng, st);
    stage = "mask analysis";
    check_mask_analysis(c, p, env, rng, st);
    stage = "differentiation";
    bool has_grad = false;
    check_derivative(c, p, env, rng, st, &has_grad);
    stage = "codegen";
    std::vector<fa::GeneratedKernel> gen;
    gen.push_back(fa::generate(p, spec_of(c, fa::KernelKind::kForward)));
    gen.push_back(fa::generate(p, spec_of(c, fa::KernelKind::kBlockMask)));
    if (has_grad) {
      try {
        gen.push_back(fa::generate(p, spec_of(c, fa::KernelKind::kBackward)));
      } catch (const fa::Error& err) {
        // a wide head's backward tiles past the arch's shared memory (sm_80: 256/256): refused
        // with the limit named
        if (std::string(err.what()).find("bytes of shared memory") == std::string::npos) throw;
      }
    }
    // The forward's row-max twin (ForwardOptions::max_scores), compiled on the compiled cases
    // that skip the backward.
    fa::KernelSpec twin = spec_of(c, fa::KernelKind::kForward);
    twin.row_max = true;
    gen.push_back(fa::generate(p, twin));
    st.sources += static_cast<int64_t>(gen.size());
    st.kv_linear_found += gen[0].source.find("kScoreKvLinear = true") != std::string::npos;
    st.kv_range_found += gen[0].source.find("kMaskKvRange = true") != std::string::npos;
    if (nvrtc) {
      stage = "nvrtc";
      // The forward always; the backward (three kernels, slower) on every other compiled case,
      // the row-max twin on the others.
      const size_t twin_at = gen.size() - 1;
      for (size_t i = 0; i < gen.size(); ++i) {
        if (i == 1 || (i == 2 && i != twin_at && c.index % 2) || (i == twin_at && c.index % 2 == 0)) continue;
        fa::jit::CompileOptions o;
        o.arch = gen[i].spec.arch;
        fa::jit::Nvrtc::get().compile(gen[i].source, gen[i].kernel_name + ".cu", o);
        ++st.nvrtc;
      }
    }
  } catch (const Failure& f) {
    return stage + ": " + f.what;
  } catch (const std::exception& e) {
    return stage + ": unexpected error: " + e.what();
  }
  return "";
}

int run(const Config& cfg, std::ostream& out) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  int first = cfg.only_case >= 0 ? cfg.only_case : 0;
  int last = cfg.only_case >= 0 ? cfg.only_case + 1 : cfg.cases;
  out << fmt::format("fajit fuzz: seed {} cases [{}, {}){}{}\n", cfg.seed, first, last,
                     cfg.gpu ? " gpu" : " cpu",
                     cfg.seconds > 0 ? fmt::format(" within {} s", cfg.seconds) : "");
  if (cfg.gpu) {
    if (std::string why = gpu_unavailable(); !why.empty()) {
      out << "fajit fuzz: --gpu needs a GPU: " << why << "\n";
      return 1;
    }
  }
  int failures = 0, ran = 0;
  Stats st;
  for (int k = first; k < last; ++k) {
    if (cfg.seconds > 0 && std::chrono::duration<double>(clock::now() - t0).count() > cfg.seconds) break;
    Case c = generate_case(cfg.seed, k, cfg.kv_linear, cfg.kv_range, cfg.tile_edges);
    st.text_cases += c.text;
    st.kv_linear += c.kv_linear;
    st.kv_range += c.kv_range;
    st.tile_edges += c.tile_edges;
    st.led += c.shape.len_q % 192 == 64;
    st.identity_scores += c.score->op == Op::kScoreArg;
    st.gqa += c.shape.heads_q != c.shape.heads_kv;
    st.long_seqs += std::max(c.shape.len_q, c.shape.len_kv) > 2048;
    bool nvrtc = cfg.only_case >= 0 || (cfg.nvrtc_every > 0 && k % cfg.nvrtc_every == 0);
    if (cfg.verbose) out << fmt::format("case {}:\n{}", k, describe(c));
    auto tc = clock::now();
    std::string err = check_cpu(c, nvrtc, &st);
    st.t_cpu += std::chrono::duration<double>(clock::now() - tc).count();
    if (err.empty() && cfg.gpu) {
      // One line per case, flushed before the kernels run: a case that hangs or crashes the
      // process is the last one named in its log.
      out << fmt::format("case {} ...", k) << std::flush;
      auto tg = clock::now();
      const double inner = st.t_compile + st.t_reference;
      try {  // a library error on a valid case is a finding of this case, not the end of the run
        err = check_gpu(c, &st);
      } catch (const std::exception& e) {
        err = std::string("GPU check threw: ") + e.what();
      }
      const double took = std::chrono::duration<double>(clock::now() - tg).count();
      st.t_gpu_other += took - (st.t_compile + st.t_reference - inner);
      out << fmt::format(" {} {:.1f} s\n", err.empty() ? "ok" : "FAILED", took) << std::flush;
    }
    ++ran;
    if (err.empty()) continue;
    ++failures;
    std::string mlir;
    try {
      mlir = program_of(c).to_mlir();
    } catch (const std::exception& e) {
      mlir = std::string("(does not build: ") + e.what() + ")\n" + (c.text ? mlir_text(c) : "");
    }
    out << fmt::format("FAIL seed {} case {}: {}\n{}{}replay: {} fuzz --seed {} --case {}{}\n\n", cfg.seed, k,
                       err, describe(c), mlir, cfg.self, cfg.seed, k,
                       std::string(cfg.gpu ? " --gpu" : "") + (cfg.kv_linear ? " --kv-linear" : "") +
                           (cfg.kv_range ? " --kv-range" : "") + (cfg.tile_edges ? " --tile-edges" : ""));
    out << std::flush;
  }
  double secs = std::chrono::duration<double>(clock::now() - t0).count();
  out << fmt::format(
      "fajit fuzz: {} case{}, {} failure{}, {:.1f} s\n"
      "  interpreter vs graph: {} points ({} non-finite score_mod results)\n"
      "  mask analysis vs brute force: {} blocks ({} left undecided by the analysis)\n"
      "  derivative vs central differences: {} points checked, {} skipped by the kink rule; {} score_mods "
      "without a derivative\n"
      "  codegen: {} sources generated, {} NVRTC compiles\n"
      "  mix: {} MLIR-text cases, {} identity score_mods, {} GQA shapes, {} with a length > 2048, {} "
      "kv-linear score_mods (--kv-linear; {} found so by codegen), {} interval masks (--kv-range; {} forward "
      "sources with one), {} tile-edge lengths (--tile-edges; {} cases with Lq % 192 = 64)\n",
      ran, ran == 1 ? "" : "s", failures, failures == 1 ? "" : "s", secs, st.points, st.nonfinite_scores,
      st.blocks, st.undecided, st.fd_checked, st.fd_skipped, st.no_derivative, st.sources, st.nvrtc,
      st.text_cases, st.identity_scores, st.gqa, st.long_seqs, st.kv_linear, st.kv_linear_found, st.kv_range,
      st.kv_range_found, st.tile_edges, st.led);
  if (cfg.gpu)
    out << fmt::format(
        "  gpu: {} forwards, {} ragged/paged layouts, {} backwards compared with the float64 reference; {} "
        "rows in {} cases over the bound but inside the reference's f32 envelope (ill-conditioned), {} "
        "rows whose LSE only a device's transcendentals moved past the bound, {} "
        "backwards within the reference's own spread, {} gradient elements in {} cases with no answer at "
        "f32\n"
        "  gpu variety: {} cases with strided operands, {} backwards with a dLSE, {} deterministic, {} "
        "buffer gradients compared, {} forwards with max_scores, {} with the mask's tables on the device\n"
        "  time: {:.1f} s CPU checks, {:.1f} s fa::compile (NVRTC), {:.1f} s float64 references, {:.1f} s "
        "the "
        "rest (inputs, kernels, comparisons)\n",
        st.gpu_forward, st.gpu_layouts, st.gpu_backward, st.ill_rows, st.ill_cases, st.lse_mod_rows,
        st.ill_backward, st.unstable_grad_elems, st.unstable_grad_cases, st.strided, st.with_dlse,
        st.deterministic, st.buffer_grads, st.with_max_scores, st.device_tables, st.t_cpu, st.t_compile,
        st.t_reference, st.t_gpu_other);
  return failures;
}

}  // namespace fa_fuzz
