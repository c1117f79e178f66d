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
  // The derivative of `score` (fa-differentiate), built with the program in a module of its
  // own (to_mlir() prints the mods only): null when the score_mod has no derivative, with the
  // pass's diagnostic in score_grad_error. Declared after `context`, so destroyed before it.
  mlir::OwningOpRef<mlir::ModuleOp> grad_module;
  mutable mlir::fa::ScoreGradOp score_grad;
  std::string score_grad_error;
};

namespace detail {

// A fresh context with the fa dialect (and arith/math) loaded, single-threaded.
std::unique_ptr<mlir::MLIRContext> make_context();

// Verifies (ops + module-level checks), canonicalizes and CSEs `module`, fills in a missing
// score_mod/mask_mod, and wraps it. Diagnostics are collected into the fa::Error message.
Program finish_program(std::unique_ptr<mlir::MLIRContext> ctx, mlir::OwningOpRef<mlir::ModuleOp> module,
                       std::string_view what);

// The derivative of the program's score_mod; throws fa::Error with the differentiation pass's
// diagnostic when it has none ("cannot differentiate score_mod @f:\n...: 'math.floor' op has
// no derivative ...").
mlir::fa::ScoreGradOp score_grad_of(const Program& program);

// The f32 buffers the score_mod reads, by capture name in capture order: the buffers a
// gradient can be asked for.
std::vector<std::string> gradient_buffers(const Program& program);

// Checks that each of `requested` names a buffer in gradient_buffers(program); throws
// fa::Error otherwise: "capture 'doc' is an i32 buffer: integer buffers have no gradient",
// "score_mod @alibi does not read a float buffer named 'bias'".
void check_gradient_buffers(const Program& program, const std::vector<std::string>& requested);

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
