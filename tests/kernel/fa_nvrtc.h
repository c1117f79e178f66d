// Test helper: compile a forward-kernel variant through fa::jit::Nvrtc, the way libfajit does:
// the device headers come from the embedded table (templates/, built into the binary), so no
// file is read and no toolkit header is needed.
#pragma once

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "fajit/detail/codegen.h"
#include "fajit/jit/nvrtc.h"
#include "fajit/kernel_spec.h"

namespace fa_test {

// The host's default tile (fa::default_tile, the only source of defaults) as template
// arguments that pick the score_mod or the no-score_mod tile by FaMods::kHasScoreMod.
inline std::string default_tile_args(int dqk, int dv, fa::KernelFamily family) {
  const fa::TileConfig plain = fa::default_tile(dqk, dv, false, family);
  const fa::TileConfig modded = fa::default_tile(dqk, dv, true, family);
  auto pick = [](int a, int b) {
    return a == b ? std::to_string(a)
                  : "(FaMods::kHasScoreMod ? " + std::to_string(b) + " : " + std::to_string(a) + ")";
  };
  if (family == fa::KernelFamily::kWgmma) {
    // Sm90FwdConfig: BLOCK_N, STAGES, OVERLAP, PINGPONG, EARLY_K, CONSUMERS (BLOCK_M / 64)
    const std::string early = fa::sm90_forward_early_k(plain) ? "true" : "false";  // the tile is plain's
    return pick(plain.block_n, modded.block_n) + ", " + pick(plain.stages, modded.stages) + ", true, true, " +
           early + ", " + pick(plain.block_m / 64, modded.block_m / 64);
  }
  return pick(plain.block_m, modded.block_m) + ", " + pick(plain.block_n, modded.block_n) + ", " +
         pick(plain.warps, modded.warps) + ", " + pick(plain.stages, modded.stages);
}

// Mods: a complete `struct FaMods {...};` definition. Config: the template arguments of
// fa::FwdConfig after the element type and head dims ("" = the host's default tile).
inline std::string variant_source(const std::string& mods, const std::string& element, int dqk, int dv,
                                  const std::string& config = "") {
  std::ostringstream s;
  s << "#include \"fajit/params.h\"\n#include \"fajit/prelude.cuh\"\n"
    << mods << "\n#include \"fajit/forward.cuh\"\n";
  s << "using FaConfig = fa::FwdConfig<fa::" << element << ", " << dqk << ", " << dv << ", "
    << (config.empty() ? default_tile_args(dqk, dv, fa::KernelFamily::kMmaSync) : config) << ">;\n";
  s << "FAJIT_DEFINE_FORWARD(fajit_fwd, FaConfig, FaMods)\n"
    << "extern \"C\" __global__ void fajit_fwd_smem_bytes(int* out) { *out = FaConfig::kSmemBytes;"
       " out[1] = FaConfig::kThreads; out[2] = FaConfig::kBlockM; out[3] = FaConfig::kBlockN; }\n";
  return s.str();
}

// The sm_90a kernel (forward_sm90.cuh). Config: the template arguments of fa::Sm90FwdConfig
// after the element type and head dims ("BLOCK_N,STAGES,OVERLAP"; "" = the host's default tile).
inline std::string variant_source_sm90(const std::string& mods, const std::string& element, int dqk, int dv,
                                       const std::string& config = "") {
  std::ostringstream s;
  s << "#include \"fajit/params.h\"\n#include \"fajit/prelude.cuh\"\n"
    << mods << "\n#include \"fajit/forward_sm90.cuh\"\n";
  s << "using FaConfig = fa::Sm90FwdConfig<fa::" << element << ", " << dqk << ", " << dv << ", "
    << (config.empty() ? default_tile_args(dqk, dv, fa::KernelFamily::kWgmma) : config) << ">;\n";
  s << "FAJIT_DEFINE_FORWARD_SM90(fajit_fwd, FaConfig, FaMods)\n"
    << "extern \"C\" __global__ void fajit_fwd_smem_bytes(int* out) { *out = FaConfig::kSmemBytes;"
       " out[1] = FaConfig::kThreads; out[2] = FaConfig::kBlockM; out[3] = FaConfig::kBlockN; }\n";
  return s.str();
}

// The backward kernels (backward.cuh). Config: the template arguments of fa::BwdConfig after
// the element type and head dims ("BLOCK_M,WARPS"); defines fajit_bwd_{pre,dkdv,dq}.
inline std::string backward_source(const std::string& mods, const std::string& element, int dqk, int dv,
                                   const std::string& config) {
  std::ostringstream s;
  s << "#include \"fajit/params.h\"\n#include \"fajit/prelude.cuh\"\n"
    << mods << "\n#include \"fajit/backward.cuh\"\n"
    << "using FaBwdCfg = fa::BwdConfig<fa::" << element << ", " << dqk << ", " << dv << ", " << config
    << ">;\nFAJIT_DEFINE_BACKWARD(fajit_bwd, FaBwdCfg, FaMods)\n";
  return s.str();
}

// The Hopper backward (backward_sm90.cuh): config = "D, BLOCK_M, STAGES, DETERMINISTIC".
inline std::string backward_sm90_source(const std::string& mods, const std::string& element,
                                        const std::string& config,
                                        const std::string& config_template = "Sm90BwdConfig") {
  std::ostringstream s;
  s << "#include \"fajit/params.h\"\n#include \"fajit/prelude.cuh\"\n"
    << mods << "\n#include \"fajit/backward_sm90.cuh\"\n"
    << "using FaBwdCfg = fa::" << config_template << "<fa::" << element << ", " << config
    << ">;\nFAJIT_DEFINE_BACKWARD_SM90(fajit_bwd, FaBwdCfg, FaMods)\n";
  return s.str();
}

struct Compiled {
  std::vector<char> cubin;
  std::string log;
  double seconds = 0;
  int regs = -1, spill_stores = -1, spill_loads = -1;
};

// Parses ptxas -v lines for the kernel `entry` ("Used N registers", "N bytes spill ...").
inline void parse_ptxas(Compiled& c, const std::string& entry) {
  size_t pos = c.log.find("Compiling entry function '" + entry + "'");
  if (pos == std::string::npos) return;
  std::smatch m;
  std::string tail = c.log.substr(pos, 600);
  if (std::regex_search(tail, m, std::regex("(\\d+) bytes spill stores, (\\d+) bytes spill loads")))
    c.spill_stores = std::stoi(m[1]), c.spill_loads = std::stoi(m[2]);
  if (std::regex_search(tail, m, std::regex("Used (\\d+) registers"))) c.regs = std::stoi(m[1]);
}

// Throws fa::Error (kCompile) with NVRTC's log when the variant does not compile.
inline Compiled compile(const std::string& src, const std::string& arch, bool verbose_ptxas = true,
                        const std::string& entry = "fajit_fwd") {
  fa::jit::CompileOptions opt;
  opt.arch = arch;
  if (verbose_ptxas) opt.extra.push_back("--ptxas-options=-v");
  fa::jit::CompileResult r = fa::jit::Nvrtc::get().compile(src, "fajit_variant.cu", opt);
  Compiled c;
  c.seconds = r.wall_ms / 1000.0;
  c.log = std::move(r.log);
  c.cubin.assign(r.cubin.begin(), r.cubin.end());
  parse_ptxas(c, entry);
  return c;
}

// Mods used by the compile test and the GPU check.
inline const char* mods_noop() {
  return R"(struct FaMods {
  static constexpr bool kHasScoreMod = false;
  static constexpr bool kHasMaskMod = false;
  static __device__ __forceinline__ float score_mod(float s, int, int, int, int, const FaCaptures&) { return s; }
  static __device__ __forceinline__ bool mask_mod(int, int, int, int, const FaCaptures&) { return true; }
  static constexpr bool kMaskReadsBuffers = false;
  static constexpr bool kScoreGrad = false;
  static __device__ __forceinline__ float score_grad(float, int, int, int, int, float dt, const FaCaptures&,
                                                     const FaGradBuffers&) { return dt; }
};)";
}
inline const char* mods_alibi_causal() {
  return R"(struct FaMods {
  static constexpr bool kHasScoreMod = true;
  static constexpr bool kHasMaskMod = true;
  static __device__ __forceinline__ float score_mod(float s, int b, int h, int q, int kv, const FaCaptures& cap) {
    const float slope = static_cast<const float*>(cap.buffers[0].ptr)[h * cap.buffers[0].stride[0]];
    return s + slope * static_cast<float>(kv - q);
  }
  static __device__ __forceinline__ bool mask_mod(int b, int h, int q, int kv, const FaCaptures& cap) { return q >= kv; }
  // d/dscore = 1; d/dslope[h] = kv - q, accumulated into the slopes' gradient when wanted.
  static constexpr bool kMaskReadsBuffers = false;
  static constexpr bool kScoreGrad = true;
  static __device__ __forceinline__ float score_grad(float s, int b, int h, int q, int kv, float dt,
                                                     const FaCaptures& cap, const FaGradBuffers& grads) {
    if (grads.buffers[0].ptr) fa::red_add_f32(grads.buffers[0].ptr + h * grads.buffers[0].stride[0],
                                              dt * static_cast<float>(kv - q));
    return dt;
  }
};)";
}

}  // namespace fa_test
