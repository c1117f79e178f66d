// Block-mask construction on the CPU: fa::analyze_block_mask (symbolic) and fa::BlockMask
// (tables) for library masks at Lq = Lkv = 8k, 32k, 128k, block 128, B = H = 1.
//   build/bench/fajit_bench_mask [--quick] [--only SPEC] [--device]
// Columns (medians; each timed run builds a fresh mask and destroys it):
//   analysis_ms  analyze_block_mask
//   from_kinds   BlockMask::from_kinds(kinds) on a copy of the analysis' kinds (moved in)
//   kv_tables    first kv_num_blocks()/kv_indices()/full_kv_*() on a fresh mask (the host kv
//                tables; 0 when from_kinds builds them eagerly)
//   q_tables     first q_num_blocks()/q_indices()/full_q_*() after the kv tables
//   build_ms     analysis + from_kinds, end to end: a BlockMask ready for fill()/forward
//   all8_ms      build_ms + all eight host tables, end to end
// --device (needs a GPU), per mask and L, on fresh masks in a warm context:
//   fill_ms      the first BlockMask::fill (what a forward needs: the kv tables on the device)
//   dev8_ms      the first BlockMask::device_tables (all eight tables on the device)
//   e2e_fill_ms  analysis + from_kinds + fill, end to end
//   and checks the device tables against the host ones (uploaded before and after those).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fajit/block_mask.h"
#include "fajit/detail/mask_analysis.h"
#include "fajit/frontend.h"
#include "fajit/mods.h"
#include "fajit/params.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point a) {
  return std::chrono::duration<double, std::milli>(Clock::now() - a).count();
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename F>
double median_ms(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = Clock::now();
    f();
    t.push_back(ms_since(a));
  }
  return median(t);
}

int64_t touch_kv(const fa::BlockMask& m) {
  return int64_t(m.kv_num_blocks().size()) + int64_t(m.kv_indices().size()) +
         int64_t(m.full_kv_num_blocks().size()) + int64_t(m.full_kv_indices().size());
}
int64_t touch_q(const fa::BlockMask& m) {
  return int64_t(m.q_num_blocks().size()) + int64_t(m.q_indices().size()) +
         int64_t(m.full_q_num_blocks().size()) + int64_t(m.full_q_indices().size());
}

std::vector<int32_t> download(const int* p, size_t n) {
  std::vector<int32_t> v(n);
  FA_CU(cuMemcpyDtoH, v.data(), reinterpret_cast<CUdeviceptr>(p), n * sizeof(int32_t));
  return v;
}

// The device tables of `m` equal its host tables.
bool device_matches(const fa::BlockMask& m) {
  const fa::BlockMaskDeviceTables d = m.device_tables();
  return download(d.kv_num_blocks, m.kv_num_blocks().size()) == m.kv_num_blocks() &&
         download(d.kv_indices, m.kv_indices().size()) == m.kv_indices() &&
         download(d.full_kv_num_blocks, m.full_kv_num_blocks().size()) == m.full_kv_num_blocks() &&
         download(d.full_kv_indices, m.full_kv_indices().size()) == m.full_kv_indices() &&
         download(d.q_num_blocks, m.q_num_blocks().size()) == m.q_num_blocks() &&
         download(d.q_indices, m.q_indices().size()) == m.q_indices() &&
         download(d.full_q_num_blocks, m.full_q_num_blocks().size()) == m.full_q_num_blocks() &&
         download(d.full_q_indices, m.full_q_indices().size()) == m.full_q_indices();
}

int device_bench(bool quick) {
  fa::rt::ContextGuard guard;
  (void)fa::BlockMask::all_full(1, 1, 128, 128).device_tables();  // context, allocator warm
  std::printf("%-16s %7s %9s %9s %12s %8s\n", "mask", "L", "fill_ms", "dev8_ms", "e2e_fill_ms", "check");
  bool all_ok = true;
  for (const char* spec : {"causal", "sliding:1024", "prefix_lm:2048"}) {
    fa::mods::Preset<fa::MaskMod> p = fa::mods::mask_preset(spec);
    fa::Program prog = fa::trace(fa::identity_score(), p.mod);
    fa::MaskRangeProgram rp = fa::MaskRangeProgram::compile(prog);
    fa::ScalarValues sv = fa::scalar_values_of(p.scalar_values, prog);
    for (int64_t len : {8192, 32768, 131072}) {
      const int reps = quick ? 3 : 11;
      const fa::MaskAnalysis a = fa::analyze_block_mask(rp, 1, 1, len, len, 128, 128, sv);
      std::vector<double> tf, td, te;
      for (int i = 0; i < reps; ++i) {
        fa::BlockMask m = fa::BlockMask::from_kinds(a.batch, a.heads, len, len, a.kinds);
        FaBlockTables t{};
        auto t0 = Clock::now();
        m.fill(t);
        tf.push_back(ms_since(t0));
        fa::BlockMask m2 = fa::BlockMask::from_kinds(a.batch, a.heads, len, len, a.kinds);
        auto t1 = Clock::now();
        (void)m2.device_tables();
        td.push_back(ms_since(t1));
        auto t2 = Clock::now();
        fa::MaskAnalysis b = fa::analyze_block_mask(rp, 1, 1, len, len, 128, 128, sv);
        fa::BlockMask m3 = fa::BlockMask::from_kinds(b.batch, b.heads, len, len, std::move(b.kinds));
        FaBlockTables t3{};
        m3.fill(t3);
        te.push_back(ms_since(t2));
      }
      // Device tables uploaded before the host tables exist, and after.
      fa::BlockMask before = fa::BlockMask::from_kinds(a.batch, a.heads, len, len, a.kinds);
      (void)before.device_tables();
      fa::BlockMask after = fa::BlockMask::from_kinds(a.batch, a.heads, len, len, a.kinds);
      (void)after.kv_indices();
      (void)after.q_indices();
      const bool ok = device_matches(before) && device_matches(after);
      all_ok = all_ok && ok;
      std::printf("%-16s %7lld %9.3f %9.3f %12.3f %8s\n", spec, static_cast<long long>(len), median(tf),
                  median(td), median(te), ok ? "ok" : "MISMATCH");
    }
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;  // --only SPEC: one mask
  bool device = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    if (std::strcmp(argv[i], "--device") == 0) device = true;
  }
  if (device) return device_bench(quick);
  const char* specs[] = {"causal",       "sliding:1024",   "prefix_lm:2048",
                         "padding:1000", "dilated:1024:4", "document"};
  std::printf("%-16s %7s %9s %8s %12s %11s %10s %9s %9s %9s\n", "mask", "L", "blocks", "decided",
              "analysis_ms", "from_kinds", "kv_tables", "q_tables", "build_ms", "all8_ms");
  int64_t sink = 0;
  for (const char* spec : specs) {
    if (!only.empty() && only != spec) continue;
    fa::mods::Preset<fa::MaskMod> p = fa::mods::mask_preset(spec);
    fa::Program prog = fa::trace(fa::identity_score(), p.mod);
    fa::MaskRangeProgram rp = fa::MaskRangeProgram::compile(prog);
    fa::ScalarValues sv = fa::scalar_values_of(p.scalar_values, prog);
    for (int64_t len : {8192, 32768, 131072}) {
      const int reps = quick ? 3 : (len > 40000 ? 21 : 51);
      fa::MaskAnalysis a;
      const double analysis =
          median_ms(reps, [&] { a = fa::analyze_block_mask(rp, 1, 1, len, len, 128, 128, sv); });
      double from_kinds = -1, kv = -1, q = -1, build = -1, all8 = -1;
      if (a.undecided == 0) {
        std::vector<double> tf, tkv, tq, tb, ta;
        for (int i = 0; i < reps; ++i) {
          std::vector<uint8_t> kinds = a.kinds;
          auto t0 = Clock::now();
          fa::BlockMask m = fa::BlockMask::from_kinds(a.batch, a.heads, len, len, std::move(kinds));
          tf.push_back(ms_since(t0));
          auto t1 = Clock::now();
          sink += touch_kv(m);
          tkv.push_back(ms_since(t1));
          auto t2 = Clock::now();
          sink += touch_q(m);
          tq.push_back(ms_since(t2));
        }
        for (int i = 0; i < reps; ++i) {
          auto t0 = Clock::now();
          fa::MaskAnalysis b = fa::analyze_block_mask(rp, 1, 1, len, len, 128, 128, sv);
          fa::BlockMask m = fa::BlockMask::from_kinds(b.batch, b.heads, len, len, std::move(b.kinds));
          tb.push_back(ms_since(t0));
          sink += touch_kv(m) + touch_q(m);
          ta.push_back(ms_since(t0));
        }
        from_kinds = median(tf);
        kv = median(tkv);
        q = median(tq);
        build = median(tb);
        all8 = median(ta);
      }
      std::printf("%-16s %7lld %9zu %8lld %12.3f %11.3f %10.3f %9.3f %9.3f %9.3f\n", spec,
                  static_cast<long long>(len), a.kinds.size(), static_cast<long long>(a.decided), analysis,
                  from_kinds, kv, q, build, all8);
    }
  }
  return sink == 42 ? 1 : 0;
}
