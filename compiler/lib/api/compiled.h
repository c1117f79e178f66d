// One generated kernel compiled (or fetched from the cache): what fa::Kernel and the
// autotuner hold. Private to compiler/lib/api.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "fajit/detail/codegen.h"
#include "fajit/jit/compile.h"

namespace fa::detail {

struct Compiled {
  GeneratedKernel gen;
  std::string key;
  std::shared_ptr<const jit::Entry> entry;
  CacheOrigin origin = CacheOrigin::kCompiled;
  jit::CompileOptions options;
};

// "score_mod @S mask_mod @M": how errors and cache metadata name a variant's kernels.
std::string variant_name(const Program& p);

// What compile_generated asks the cache for: `gen`'s source, spec and options.
jit::KernelRequest kernel_request(const GeneratedKernel& gen, bool line_info, std::string_view what);

// `gen` through the global cache (memory, disk, NVRTC); `what` goes into the entry's meta.
Compiled compile_generated(GeneratedKernel gen, bool line_info, std::string_view what);

// The compiles fa::compile starts on background threads (backward_in_background, autotuning's
// candidates): how many may run at once, and a wait for all still running (for tests).
unsigned background_compile_slots();
void wait_for_background_compiles();

}  // namespace fa::detail
