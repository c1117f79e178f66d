// The mod fuzzer (issue 13): random, well-typed score_mod / mask_mod graphs over the tracing
// frontend, random shapes, and the checks each case must pass.
//
//   fa_fuzz::Config c;
//   c.seed = 7;
//   c.cases = 200;
//   int failures = fa_fuzz::run(c, std::cout);   // CPU mode; c.gpu adds the GPU checks
//
// A case is a pure function of (seed, index): generate_case(seed, k) builds the same graphs,
// shape, captures and sample points every time, so `fajit fuzz --seed S --case K` replays it.
// What is generated and checked: tests/fuzz/README.md.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fajit/detail/interp.h"
#include "fajit/frontend.h"
#include "fajit/types.h"

namespace fa_fuzz {

// ---- the expression graph ----------------------------------------------------------------
enum class Ty : uint8_t { kScore, kIndex, kBool };

enum class Op : uint8_t {
  // leaves
  kScoreArg,  // the score (score_mod only)
  kB,
  kH,
  kQ,
  kKv,
  kConstF,
  kConstI,
  kConstB,
  kScalarF,  // fa::scalar<float>
  kScalarI,  // fa::scalar<int32_t>
  kLoadF,    // fa::buffer<float>, kids = in-range indices
  kLoadI,    // fa::buffer<int32_t>
  // Index -> Index
  kAddI,
  kSubI,
  kMulI,
  kDivI,  // divisor is never 0 nor -1 (see README: divisor forms)
  kRemI,
  kMinI,
  kMaxI,
  kAbsI,
  kNegI,
  // Score -> Score
  kAddF,
  kSubF,
  kMulF,
  kDivF,
  kRemF,
  kMinF,
  kMaxF,
  kPowF,
  kNegF,
  kAbsF,
  kExp,
  kExp2,
  kLog,
  kLog2,
  kTanh,
  kSqrt,
  kRsqrt,
  kSin,
  kCos,
  kFloor,
  kCeil,
  kErf,
  kSigmoid,
  // comparisons -> Bool (kids of one type, `aux` the predicate 0..5: < <= > >= == !=)
  kCmpI,
  kCmpF,
  kCmpB,  // == / != on Bool (aux 4 / 5)
  kAnd,
  kOr,
  kNot,
  // where(c, a, b) of any type
  kWhere,
  // conversions
  kIToF,  // to_float(Index)
  kBToF,  // to_float(Bool)
  kFToI,  // to_int(Score)
  kBToI,  // to_int(Bool)
  // Only in MLIR-text cases (Case::text): ops the verifier accepts that the frontend cannot emit.
  kDivUI,  // divui / remui / floordivsi / ceildivsi: divisor never 0 nor -1
  kRemUI,
  kFloorDivI,
  kCeilDivI,
  kMinUI,
  kMaxUI,
  kShlI,  // shift amounts are `e & 31`
  kShrSI,
  kShrUI,
  kAndI,  // i32 bitwise
  kOrI,
  kXorI,
  kMaxNumF,
  kMinNumF,
  kCmpFX,   // cmpf with any of 14 predicates (kCmpFPreds)
  kCmpIU,   // cmpi ult / ule / ugt / uge (aux 0..3)
  kFToUI,   // fptoui
  kUIToF,   // uitofp of an i32
  kExtSI,   // i1 -> i32 (true is -1)
  kTruncI,  // i32 -> i1 (low bit)
};

struct Node;
using NodeP = std::shared_ptr<const Node>;
struct Node {
  Op op;
  Ty ty;
  std::vector<NodeP> kids;
  float f = 0;       // kConstF
  int32_t i = 0;     // kConstI, kConstB; kCmp*: predicate
  std::string name;  // scalar / buffer name
};

// A captured buffer of the case: its data lives here (host); rank 1 or 2.
struct BufferSpec {
  std::string name;
  bool is_float = true;
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<int32_t> i;
};

struct ScalarSpec {
  std::string name;
  bool is_float = false;
  double value = 0;
};

struct Shape {
  int batch = 1, heads_q = 1, heads_kv = 1, len_q = 1, len_kv = 1, dim_qk = 128, dim_v = 128;
  fa::DType dtype = fa::DType::bf16;
};

struct Case {
  uint64_t seed = 0;
  int index = 0;
  NodeP score;  // Ty::kScore
  NodeP mask;   // Ty::kBool
  std::vector<BufferSpec> buffers;
  std::vector<ScalarSpec> scalars;
  Shape shape;       // the run's shape (lengths up to 5000): GPU mode, analysis vs spot checks
  Shape small;       // a small shape for brute-force checks of the whole block grid
  std::string arch;  // NVRTC target of the codegen checks
  // Built as fa-dialect MLIR text and parsed (Program::parse), which allows the ops the frontend
  // cannot emit; else traced through the frontend.
  bool text = false;
  bool kv_linear = false;   // the score_mod rewritten as score ± rate·(kv − q) (generate_case)
  bool kv_range = false;    // the mask_mod rewritten as an interval of keys a row (generate_case)
  bool tile_edges = false;  // the lengths moved to a tile's edge (generate_case)
};

// Case `index` of a seed. With kv_linear (fajit fuzz --kv-linear), half the cases get their
// score_mod replaced by `score ± rate·(kv − q)` with a random rate free of kv (the form the
// kernels add by FMA: codegen's kScoreKvLinear), drawn from a stream of its own, so every other
// part of the case is the one the plain run draws (and the recorded regressions replay). With
// kv_range (--kv-range) likewise half the mask_mods become an interval of keys a row: compares of
// kv, kv − q or q − kv with values free of kv, some at int32's ends (codegen's kMaskKvRange,
// which the kernels apply by two bounds a row). With tile_edges (--tile-edges) half the cases get
// their lengths moved to the kernels' tile edges: a multiple of 192, 128, 112 or 64, or one
// of them and 64 or 128 rows more (Lq % 192 = 64: the persistent forward's partial block first,
// detail::lead_rows), or a row either side; the uniform draw rarely lands there.
Case generate_case(uint64_t seed, int index, bool kv_linear = false, bool kv_range = false,
                   bool tile_edges = false);
std::string to_string(const NodeP& n);  // C++-like text of the graph
std::string describe(const Case& c);    // mods as expressions, captures, shapes

// The case's program: traced from the frontend mods, or parsed from mlir_text(c) for text cases.
fa::Program program_of(const Case& c);
std::string mlir_text(const Case& c);  // the graphs as an fa-dialect module (any case)

// The frontend mods of a case (named fuzz_score / fuzz_mask).
fa::ScoreMod score_mod_of(const Case& c);
fa::MaskMod mask_mod_of(const Case& c);
fa::Bindings bindings_of(const Case& c);  // refers to c's buffers

// The case's graph evaluated directly, with the interpreter's semantics (interp.h) in T = float,
// or in double for finite differences. `branches`, when given, collects one entry per
// non-smooth node evaluated (which side of a where/min/max/abs/compare/floor... was taken, and
// the sign of each divisor and log/sqrt/rsqrt/pow argument); `magnitude` gets the largest
// finite |float value| computed. `f32_invariants` (T = double): every float subtree that reads
// neither the score nor a buffer `perturb` moves is evaluated in float, as the kernel and the
// interpreter compute it, so a difference quotient in the score (or a buffer element) meets the
// same constants as the f32 derivative it checks (cos(w·kv) at w·kv = 7158: f32's rounding of
// the product moves the cosine near its zero by 15 %; the replay seed 4242 case 12785).
// `ulps`: every transcendental's finite result (pow, exp, exp2, log, log2, tanh, rsqrt, sin, cos,
// erf, sigmoid; not sqrt, which the device rounds correctly too) moved by that many ulps of T,
// as a device's libm within a few ulps of the host's may give it (compare.cpp, mod_rounding).
struct Point {
  int b = 0, h = 0, q = 0, kv = 0;
};
template <typename T>
T eval_score(const Case& c, const NodeP& n, T score, const Point& p, std::vector<int64_t>* branches = nullptr,
             const std::map<std::pair<std::string, int64_t>, double>* perturb = nullptr,
             double* magnitude = nullptr, bool f32_invariants = false, int ulps = 0);
bool eval_mask(const Case& c, const Point& p);

// Two f32 results the same by the fuzzer's rule: NaN with NaN, infinities exactly, else within
// 1e-4 relative (above 1; absolute below): constant folding and the host's libm may round a
// transcendental differently.
bool same_float(float a, float b);

// ---- running -----------------------------------------------------------------------------
struct Config {
  uint64_t seed = 1;
  int cases = 100;
  int only_case = -1;          // >= 0: run just this case (replay)
  double seconds = 0;          // > 0: stop starting new cases after this long
  int nvrtc_every = 10;        // NVRTC-compile the sources of every n-th case (0: never)
  bool gpu = false;            // also run the kernels on the GPU against the float64 reference
  bool verbose = false;        // print every case
  bool kv_linear = false;      // generate_case's kv-linear rewrite
  bool kv_range = false;       // generate_case's interval-mask rewrite
  bool tile_edges = false;     // generate_case's tile-edge lengths
  std::string self = "fajit";  // the replay command's program name
};

// What the checks did, summed over cases (printed at the end of a run: a check that never
// fires shows up as zeros).
struct Stats {
  int64_t points = 0;                      // interpreter-vs-graph points
  int64_t nonfinite_scores = 0;            // of those, score_mod results NaN/inf (in both, by the check)
  int64_t blocks = 0;                      // blocks compared with brute force
  int64_t undecided = 0;                   // of those, left undecided by the analysis
  int64_t fd_checked = 0, fd_skipped = 0;  // derivative points (README: the skip rule)
  int64_t no_derivative = 0;               // score_mods the differentiation pass refused (as expected)
  int64_t sources = 0, nvrtc = 0;          // generated sources, NVRTC compiles
  int64_t text_cases = 0, identity_scores = 0, gqa = 0, long_seqs = 0;  // the case mix
  int64_t kv_linear = 0;        // cases with generate_case's kv-linear rewrite
  int64_t kv_linear_found = 0;  // cases whose forward source codegen made kv-linear (any mod)
  int64_t kv_range = 0;         // cases with generate_case's interval-mask rewrite
  int64_t kv_range_found = 0;   // cases whose forward source codegen made an interval mask (any mask)
  int64_t tile_edges = 0;       // cases with generate_case's tile-edge lengths
  int64_t led = 0;              // of all cases, those with Lq % 192 == 64 (the led partial block's lengths)
  // GPU mode: cases whose forward / ragged-paged layouts / backward were compared, and where the
  // time went (seconds: CPU checks, fa::compile incl. NVRTC, float64 references, the rest).
  int64_t gpu_forward = 0, gpu_layouts = 0, gpu_backward = 0;
  // Forward rows over the bound but inside the reference's f32 rounding envelope (gpu.cpp
  // compare_forward: ill-conditioned score_mods), and the cases that had any.
  int64_t ill_rows = 0, ill_cases = 0;
  // Forward rows whose only fault was an LSE a device's transcendentals may move (compare.cpp's
  // mod_rounding slack): passed, counted so a slack that swallows too much shows.
  int64_t lse_mod_rows = 0;
  // Backwards over the bound but within the reference's spread under those moves; gradient
  // elements left out as having no answer at f32 (fed by a pair compare.h's unstable_gradients
  // finds, or non-finite in a moved reference where the reference is finite), and the cases
  // that had any.
  int64_t ill_backward = 0, unstable_grad_elems = 0, unstable_grad_cases = 0;
  // GPU mode's variety: cases with strided operands, backwards with a dLSE, deterministic
  // backwards, buffer gradients compared, forwards with max_scores.
  int64_t strided = 0, with_dlse = 0, deterministic = 0, buffer_grads = 0, with_max_scores = 0;
  int64_t device_tables = 0;  // dense cases whose mask's kv tables the kernels read on the device
  double t_cpu = 0, t_compile = 0, t_reference = 0, t_gpu_other = 0;
};

// One case's CPU checks; returns "" or the failure text (the first failing check).
std::string check_cpu(const Case& c, bool nvrtc, Stats* stats = nullptr);
// One case's GPU checks (tests/fuzz/gpu.cpp); "" or the failure text.
std::string check_gpu(const Case& c, Stats* stats = nullptr);
// Why the GPU mode cannot run here ("" when it can).
std::string gpu_unavailable();

// Runs the cases, prints progress and each failure (seed, case, mods as MLIR, shape, replay
// command) to `out`. Returns the number of failing cases.
int run(const Config& config, std::ostream& out);

}  // namespace fa_fuzz
