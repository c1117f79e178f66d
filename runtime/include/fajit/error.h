// fa::Error: the one exception type fajit throws. Only the fa dialect (verifiers, passes)
// reports through MLIR diagnostics and LogicalResult; the layers above it (tracing and parsing,
// the interpreter, the mask analysis, codegen, the JIT) throw fa::Error directly, with any
// MLIR diagnostics collected into the message, as do the runtime and the C++ API. The C API
// turns it into an error code plus message, the CLI into "fajit: error: ...".
#pragma once

#include <stdexcept>
#include <string>

#include "fajit/export.h"

namespace fa {

// What went wrong, coarsely, so callers (and the C API) can branch without parsing text.
enum class ErrorCode {
  kInvalidArgument = 1,  // bad user input: shapes, names, presets, flags, IR
  kCompile = 2,          // NVRTC rejected generated code
  kCuda = 3,             // a CUDA driver call failed, or no driver/GPU
  kIo = 4,               // cache or file I/O
  kInternal = 5,
};

class FA_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorCode code = ErrorCode::kInvalidArgument)
      : std::runtime_error(what), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace fa
