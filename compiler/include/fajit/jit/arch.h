// Target architectures for run-time compilation: validation of "sm_XX" strings and the
// mapping from a device's compute capability to the arch fajit compiles for.
//
//   std::string arch = fa::jit::arch_for_device(9, 0);   // "sm_90a" (wgmma, TMA)
//   fa::jit::validate_arch("sm_86");                      // ok
//   fa::jit::validate_arch("sm_7");                       // throws fa::Error
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fa::jit {

// The arch strings fajit accepts, oldest first: sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a, ...
const std::vector<std::string>& known_archs();

// Returns `arch` if it is one of known_archs(); otherwise throws fa::Error
// (kInvalidArgument): "unknown target arch 'sm_7'; expected sm_80, sm_86, ...".
std::string validate_arch(std::string_view arch);

// The arch to compile for on a device of compute capability major.minor. sm_90 becomes
// sm_90a (the kernels use wgmma/TMA, which exist only in the arch-specific variant); other
// capabilities map to plain sm_<major><minor>. Throws fa::Error for capabilities older than
// 8.0 ("compute capability 7.5 is not supported; fajit needs sm_80 or newer") and for
// capabilities it does not know.
std::string arch_for_device(int major, int minor);

// The most dynamic shared memory one CTA may opt into on `arch` (the CUDA programming guide's
// table): 163 KiB on sm_80 / sm_87, 99 KiB on sm_86 / sm_89 / sm_12x, 227 KiB on sm_90 and
// sm_100 / sm_103 / sm_110. Tile choices are checked against it before anything compiles.
int max_dynamic_smem(std::string_view arch);

// "sm_90a" -> "compute_90a": the virtual arch NVRTC needs to produce PTX.
std::string virtual_arch(std::string_view arch);

}  // namespace fa::jit
