// Codegen: fa IR (a fa::Program) + KernelSpec -> one CUDA translation unit for NVRTC.
//
// The score_mod / mask_mod become `struct FaMods` (see templates/README.md), one SSA value
// per line, each line tagged `// fa: <the op it came from>` so an NVRTC error points back at
// the user's IR. Captured buffers and runtime scalars are read from FaCaptures slots
// (templates/fajit/params.h), so a scalar's value never changes the source.
#pragma once

#include <string>
#include <vector>

#include "fajit/export.h"
#include "fajit/frontend.h"
#include "fajit/kernel_spec.h"

namespace fa {

// Where a capture lives in FaCaptures: buffers[slot] or scalars[slot].
struct CaptureSlot {
  std::string name;
  bool is_buffer = false;
  bool is_float = false;  // f32, else i32
  int rank = 0;           // buffers only
  int slot = 0;
};

struct GeneratedKernel {
  std::string source;       // the whole translation unit
  std::string kernel_name;  // extern "C" entry point
  KernelSpec spec;          // resolved
  std::vector<CaptureSlot> slots;
};

// Slots in Program::captures() order: buffers take buffers[0..], scalars scalars[0..].
// Throws fa::Error when there are more than FA_MAX_BUFFERS / FA_MAX_SCALARS.
FA_API std::vector<CaptureSlot> capture_slots(const Program& program);

// Threads per CTA of the backward's preprocess and dQ-conversion kernels (BwdConfig::
// kPreThreads; each thread takes one 16-byte chunk of a row).
constexpr int kBwdAuxThreads = 128;

// The FaMods struct for `program`; with_backward adds the backward's members (kScoreGrad,
// score_grad: templates/fajit/backward.cuh).
FA_API std::string emit_mods(const Program& program, bool with_backward = false);

// The full source of the kernel `spec` selects.
FA_API GeneratedKernel generate(const Program& program, const KernelSpec& spec);

}  // namespace fa
