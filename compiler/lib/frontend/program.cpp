// fa::Program: a verified, simplified fa module with one score_mod and one mask_mod.
#include <algorithm>

#include <fmt/format.h>

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

#include "fajit/Dialect/FA/Passes.h"
#include "fajit/detail/program_impl.h"

namespace fa {
namespace detail {

std::unique_ptr<mlir::MLIRContext> make_context() {
  mlir::DialectRegistry registry;
  mlir::fa::registerFADialects(registry);
  auto ctx = std::make_unique<mlir::MLIRContext>(registry, mlir::MLIRContext::Threading::DISABLED);
  ctx->loadAllAvailableDialects();
  return ctx;
}

namespace {
std::string format_loc(mlir::Location loc) {
  if (auto f = llvm::dyn_cast<mlir::FileLineColLoc>(loc))
    return fmt::format("{}:{}:{}: ", f.getFilename().str(), f.getLine(), f.getColumn());
  if (auto n = llvm::dyn_cast<mlir::NameLoc>(loc)) return fmt::format("{}: ", n.getName().str());
  return "";
}
}  // namespace

DiagnosticCollector::DiagnosticCollector(mlir::MLIRContext* ctx) : ctx_(ctx) {
  id_ = ctx->getDiagEngine().registerHandler([this](mlir::Diagnostic& d) {
    const char* sev = d.getSeverity() == mlir::DiagnosticSeverity::Error     ? "error"
                      : d.getSeverity() == mlir::DiagnosticSeverity::Warning ? "warning"
                                                                             : "note";
    lines_.push_back(fmt::format("{}{}: {}", format_loc(d.getLocation()), sev, d.str()));
    for (mlir::Diagnostic& n : d.getNotes())
      lines_.push_back(fmt::format("{}note: {}", format_loc(n.getLocation()), n.str()));
    return mlir::success();
  });
}

DiagnosticCollector::~DiagnosticCollector() { ctx_->getDiagEngine().eraseHandler(id_); }

std::string DiagnosticCollector::message() const {
  std::string out;
  for (auto& l : lines_) {
    if (!out.empty()) out += '\n';
    out += l;
  }
  return out;
}

namespace {

// Adds `fa.score_mod @identity` / `fa.mask_mod @noop` when the module lacks one.
void add_missing_mods(mlir::ModuleOp module) {
  mlir::OpBuilder b(module.getContext());
  mlir::Location loc = b.getUnknownLoc();
  mlir::Type f32 = b.getF32Type(), i32 = b.getI32Type();
  if (module.getOps<mlir::fa::ScoreModOp>().empty()) {
    b.setInsertionPointToStart(module.getBody());
    auto op = b.create<mlir::fa::ScoreModOp>(loc, b.getStringAttr("identity"), mlir::TypeAttr::get(f32),
                                             b.getArrayAttr({}));
    auto* blk = new mlir::Block();
    op.getBody().push_back(blk);
    for (mlir::Type t : {f32, i32, i32, i32, i32}) blk->addArgument(t, loc);
    b.setInsertionPointToEnd(blk);
    b.create<mlir::fa::YieldOp>(loc, blk->getArgument(0));
  }
  if (module.getOps<mlir::fa::MaskModOp>().empty()) {
    b.setInsertionPointToEnd(module.getBody());
    auto op = b.create<mlir::fa::MaskModOp>(loc, b.getStringAttr("noop"), mlir::TypeAttr::get(b.getI1Type()),
                                            b.getArrayAttr({}));
    auto* blk = new mlir::Block();
    op.getBody().push_back(blk);
    for (mlir::Type t : {i32, i32, i32, i32}) blk->addArgument(t, loc);
    b.setInsertionPointToEnd(blk);
    b.create<mlir::fa::YieldOp>(loc, b.create<mlir::arith::ConstantIntOp>(loc, 1, 1));
  }
}

void collect_captures(Program::Impl& impl) {
  auto add_buffers = [&](mlir::Operation* op, bool score) {
    auto names = op->getAttrOfType<mlir::ArrayAttr>("capture_names");
    mlir::Block& entry = op->getRegion(0).front();
    unsigned fixed = entry.getNumArguments() - names.size();
    for (auto [i, n] : llvm::enumerate(names)) {
      std::string name = llvm::cast<mlir::StringAttr>(n).getValue().str();
      auto type = llvm::cast<mlir::fa::BufferType>(entry.getArgument(fixed + i).getType());
      auto it = std::find_if(impl.captures.begin(), impl.captures.end(),
                             [&](const Program::Capture& c) { return c.name == name; });
      if (it == impl.captures.end()) {
        impl.captures.push_back(
            {name, true, type.getElementType().isF32(), static_cast<int>(type.getRank()), false, false});
        it = impl.captures.end() - 1;
      }
      (score ? it->used_by_score : it->used_by_mask) = true;
    }
  };
  add_buffers(impl.score, true);
  add_buffers(impl.mask, false);
  std::map<std::string, Program::Capture> scalars;
  auto add_scalars = [&](mlir::Operation* op, bool score) {
    op->walk([&](mlir::fa::ScalarOp s) {
      auto& c = scalars[s.getName().str()];
      c.name = s.getName().str();
      c.is_buffer = false;
      c.is_float = s.getType().isF32();
      c.rank = 0;
      (score ? c.used_by_score : c.used_by_mask) = true;
    });
  };
  add_scalars(impl.score, true);
  add_scalars(impl.mask, false);
  for (auto& [_, c] : scalars) impl.captures.push_back(c);
}

// Builds impl.score's derivative in a module of its own; a score_mod without one is no error
// here (forward kernels do not need it): the reason is kept for whoever asks.
void differentiate(Program::Impl& impl) {
  mlir::MLIRContext* ctx = impl.context.get();
  mlir::OpBuilder b(ctx);
  impl.grad_module = mlir::ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToStart(impl.grad_module->getBody());
  auto mod = llvm::cast<mlir::fa::ScoreModOp>(b.clone(*impl.score.getOperation()));
  DiagnosticCollector diags(ctx);
  // The diagnostic names the op already; MLIR would append the op in generic form.
  const bool print_op = ctx->shouldPrintOpOnDiagnostic();
  ctx->printOpOnDiagnostic(false);
  mlir::FailureOr<mlir::fa::ScoreGradOp> grad = mlir::fa::differentiateScoreMod(mod);
  // What fa-differentiate does next: canonicalize + CSE the derivative. Skipped when it is
  // already bare (`yield %dt`: the identity score_mod, the forward-only common case), which
  // keeps tracing cheap.
  bool ok = mlir::succeeded(grad);
  if (ok && !llvm::isa<mlir::fa::YieldOp>(grad->getEntryBlock().front())) {
    mlir::PassManager pm(ctx);
    mlir::OpPassManager& nested = pm.nest<mlir::fa::ScoreGradOp>();
    nested.addPass(mlir::createCanonicalizerPass());
    nested.addPass(mlir::createCSEPass());
    ok = mlir::succeeded(pm.run(*impl.grad_module));
  }
  ctx->printOpOnDiagnostic(print_op);
  if (!ok) {
    impl.score_grad_error = fmt::format("cannot differentiate score_mod @{}:\n{}",
                                        impl.score.getSymName().str(), diags.message());
    return;
  }
  impl.score_grad = *grad;
}

}  // namespace

mlir::fa::ScoreGradOp score_grad_of(const Program& program) {
  const Program::Impl& impl = program.impl();
  if (!impl.score_grad) throw Error(impl.score_grad_error);
  return impl.score_grad;
}

std::vector<std::string> gradient_buffers(const Program& program) {
  auto names = mlir::fa::differentiableBuffers(program.impl().score);
  return std::vector<std::string>(names.begin(), names.end());
}

void check_gradient_buffers(const Program& program, const std::vector<std::string>& requested) {
  std::vector<std::string> allowed = gradient_buffers(program);
  for (const std::string& name : requested) {
    if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) continue;
    for (const Program::Capture& c : program.captures())
      if (c.name == name && c.is_buffer && !c.is_float)
        throw Error(fmt::format("capture '{}' is an i32 buffer: integer buffers have no gradient", name));
    throw Error(
        fmt::format("score_mod @{} does not read a float buffer named '{}'", program.score_mod_name(), name));
  }
}

Program finish_program(std::unique_ptr<mlir::MLIRContext> ctx_in, mlir::OwningOpRef<mlir::ModuleOp> module_in,
                       std::string_view what) {
  // Own both at once, module destroyed before its context whatever the way out (the
  // order in which the caller destroys these parameters is unspecified).
  auto impl = std::make_shared<Program::Impl>();
  impl->context = std::move(ctx_in);
  impl->module = std::move(module_in);
  mlir::MLIRContext* ctx = impl->context.get();
  mlir::OwningOpRef<mlir::ModuleOp>& module = impl->module;
  DiagnosticCollector diags(ctx);
  auto fail = [&](std::string_view stage) {
    throw Error(fmt::format("{} {}:\n{}", what, stage, diags.message()));
  };
  if (mlir::failed(mlir::verify(*module)) || mlir::failed(mlir::fa::verifyFAModule(*module)))
    fail("failed verification");
  int scores = 0, masks = 0;
  for (mlir::Operation& op : module->getBody()->getOperations()) {
    if (llvm::isa<mlir::fa::ScoreModOp>(op))
      ++scores;
    else if (llvm::isa<mlir::fa::MaskModOp>(op))
      ++masks;
    else
      throw Error(fmt::format("{}: unexpected top-level op '{}'; expected fa.score_mod and fa.mask_mod", what,
                              op.getName().getStringRef().str()));
  }
  if (scores > 1 || masks > 1)
    throw Error(fmt::format("{} defines {} fa.score_mod and {} fa.mask_mod ops; expected at most one of each",
                            what, scores, masks));
  add_missing_mods(*module);
  mlir::PassManager pm(ctx);
  pm.addPass(mlir::createCanonicalizerPass());
  pm.addPass(mlir::fa::createFASplitIndexCasts());  // kv - q converted per row and column, not per element
  pm.addPass(mlir::createCSEPass());
  // To a fixed point: CSE can expose folds (two fa.scalar "w" merged make `cmpi sge %w, %w`
  // foldable), and a module printed and parsed again must come back unchanged (same cache key).
  for (int round = 0; round < 8; ++round) {
    mlir::OperationFingerPrint before(*module);
    if (mlir::failed(pm.run(*module))) fail("failed to simplify");
    if (mlir::OperationFingerPrint(*module) == before) break;
  }

  impl->score = *module->getOps<mlir::fa::ScoreModOp>().begin();
  impl->mask = *module->getOps<mlir::fa::MaskModOp>().begin();
  collect_captures(*impl);
  differentiate(*impl);
  return Program(std::move(impl));
}

}  // namespace detail

Program::Program(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Program Program::parse(std::string_view text, std::string_view source_name) {
  auto ctx = detail::make_context();
  mlir::OwningOpRef<mlir::ModuleOp> module;
  {
    detail::DiagnosticCollector diags(ctx.get());
    mlir::ParserConfig config(ctx.get(), /*verifyAfterParse=*/true);
    auto buffer = llvm::MemoryBuffer::getMemBuffer(llvm::StringRef(text.data(), text.size()),
                                                   llvm::StringRef(source_name.data(), source_name.size()),
                                                   /*RequiresNullTerminator=*/false);
    llvm::SourceMgr sm;
    sm.AddNewSourceBuffer(std::move(buffer), llvm::SMLoc());
    module = mlir::parseSourceFile<mlir::ModuleOp>(sm, config);
    if (!module) throw Error(fmt::format("invalid fa IR in {}:\n{}", source_name, diags.message()));
  }
  return detail::finish_program(std::move(ctx), std::move(module), source_name);
}

std::string Program::to_mlir() const {
  std::string s;
  llvm::raw_string_ostream os(s);
  mlir::OpPrintingFlags flags;
  impl_->module.get()->print(os, flags);
  return s;
}

std::string Program::score_grad_mlir() const {
  std::string s;
  llvm::raw_string_ostream os(s);
  detail::score_grad_of(*this)->print(os, mlir::OpPrintingFlags());
  os << "\n";
  return s;
}

std::string Program::score_mod_name() const { return mlir::fa::ScoreModOp(impl_->score).getSymName().str(); }
std::string Program::mask_mod_name() const { return mlir::fa::MaskModOp(impl_->mask).getSymName().str(); }

bool Program::score_is_identity() const {
  mlir::Block& entry = mlir::fa::ScoreModOp(impl_->score).getEntryBlock();
  auto y = llvm::dyn_cast<mlir::fa::YieldOp>(entry.getTerminator());
  return y && y.getValue() == entry.getArgument(0);
}

bool Program::score_grad_is_identity() const {
  if (!impl_->score_grad) return false;
  mlir::Block& entry = impl_->score_grad.getEntryBlock();
  auto y = llvm::dyn_cast<mlir::fa::YieldOp>(entry.front());
  return y && y.getValue() == entry.getArgument(5);
}

bool Program::mask_is_noop() const {
  auto y =
      llvm::dyn_cast<mlir::fa::YieldOp>(mlir::fa::MaskModOp(impl_->mask).getEntryBlock().getTerminator());
  if (!y) return false;
  auto c = y.getValue().getDefiningOp<mlir::arith::ConstantIntOp>();
  return c && c.value() != 0;
}

const std::vector<Program::Capture>& Program::captures() const { return impl_->captures; }

}  // namespace fa
