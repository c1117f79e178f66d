// Internal: what a fa::Program holds. Only compiler-side code (codegen, interpreter,
// analyses, CLI) includes this; it is not part of the installed API.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/frontend.h"

namespace fa {

struct Program::Impl {
  std::unique_ptr<mlir::MLIRContext> context;
  mlir::OwningOpRef<mlir::ModuleOp> module;
  // Op handles are cheap views; `mutable` lets const Programs hand out mlir::Operation*.
  mutable mlir::fa::ScoreModOp score;  // never null (an identity one is synthesised when missing)
  mutable mlir::fa::MaskModOp mask;    // never null (a noop one is synthesised when missing)
  std::vector<Program::Capture> captures;
};

namespace detail {

// A fresh context with the fa dialect (and arith/math) loaded, single-threaded.
std::unique_ptr<mlir::MLIRContext> make_context();

// Verifies (ops + module-level checks), canonicalizes and CSEs `module`, fills in a missing
// score_mod/mask_mod, and wraps it. Diagnostics are collected into the fa::Error message.
Program finish_program(std::unique_ptr<mlir::MLIRContext> ctx, mlir::OwningOpRef<mlir::ModuleOp> module,
                       std::string_view what);

// Collects MLIR diagnostics emitted while alive; message() joins them.
class DiagnosticCollector {
 public:
  explicit DiagnosticCollector(mlir::MLIRContext* ctx);
  ~DiagnosticCollector();
  std::string message() const;
  bool empty() const { return lines_.empty(); }

 private:
  mlir::MLIRContext* ctx_;
  unsigned long long id_;
  std::vector<std::string> lines_;
};

}  // namespace detail
}  // namespace fa
