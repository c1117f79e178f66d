#include "fajit/jit/arch.h"

#include <algorithm>

#include "fajit/error.h"

namespace fa::jit {

const std::vector<std::string>& known_archs() {
  static const std::vector<std::string> kArchs = {
      "sm_80",  "sm_86",   "sm_87",  "sm_89",   "sm_90",  "sm_90a",  "sm_100", "sm_100a",
      "sm_103", "sm_103a", "sm_110", "sm_110a", "sm_120", "sm_120a", "sm_121", "sm_121a"};
  return kArchs;
}

std::string validate_arch(std::string_view arch) {
  const auto& archs = known_archs();
  if (std::find(archs.begin(), archs.end(), arch) != archs.end()) return std::string(arch);
  std::string msg = "unknown target arch '" + std::string(arch) + "'; expected ";
  for (size_t i = 0; i < archs.size(); ++i) msg += (i ? ", " : "") + archs[i];
  throw Error(msg, ErrorCode::kInvalidArgument);
}

std::string arch_for_device(int major, int minor) {
  const std::string cc = std::to_string(major) + "." + std::to_string(minor);
  if (major < 8 || minor < 0)
    throw Error("compute capability " + cc + " is not supported; fajit needs sm_80 or newer",
                ErrorCode::kInvalidArgument);
  std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
  if (arch == "sm_90") arch = "sm_90a";
  const auto& archs = known_archs();
  if (std::find(archs.begin(), archs.end(), arch) == archs.end())
    throw Error("compute capability " + cc + " is not known to this fajit (" + arch + ")",
                ErrorCode::kInvalidArgument);
  return arch;
}

int max_dynamic_smem(std::string_view arch) {
  const std::string a = validate_arch(arch);
  if (a == "sm_80" || a == "sm_87") return 163 * 1024;
  if (a == "sm_86" || a == "sm_89" || a.rfind("sm_12", 0) == 0) return 99 * 1024;
  return 227 * 1024;  // sm_90, sm_100, sm_103, sm_110
}

std::string virtual_arch(std::string_view arch) {
  std::string a = validate_arch(arch);
  return "compute_" + a.substr(3);
}

}  // namespace fa::jit
