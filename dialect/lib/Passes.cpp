#include "fajit/Dialect/FA/Passes.h"

#include <set>

#include "llvm/ADT/StringMap.h"
#include "mlir/IR/Builders.h"

#include "fajit/Dialect/FA/FAOps.h"

namespace mlir::fa {
#define GEN_PASS_DEF_FAANNOTATEDEPS
#include "fajit/Dialect/FA/Passes.h.inc"
}  // namespace mlir::fa

using namespace mlir;
using namespace mlir::fa;

ModUses mlir::fa::computeUses(Operation *modOp) {
  ModUses uses;
  Block &entry = modOp->getRegion(0).front();
  bool isScore = isa<ScoreModOp>(modOp);
  unsigned fixed = isScore ? ScoreModOp::getNumFixedArgs() : MaskModOp::getNumFixedArgs();
  bool *flags[] = {&uses.score, &uses.b, &uses.h, &uses.q, &uses.kv};
  for (unsigned i = 0; i < fixed; ++i) *flags[i + (isScore ? 0 : 1)] = !entry.getArgument(i).use_empty();
  auto names = modOp->getAttrOfType<ArrayAttr>("capture_names");
  for (unsigned i = fixed; i < entry.getNumArguments(); ++i)
    if (!entry.getArgument(i).use_empty())
      uses.buffers.push_back(cast<StringAttr>(names[i - fixed]).getValue().str());
  std::set<std::string> scalars;
  for (auto s : entry.getOps<ScalarOp>()) scalars.insert(s.getName().str());
  uses.scalars.assign(scalars.begin(), scalars.end());
  return uses;
}

LogicalResult mlir::fa::verifyFAModule(ModuleOp module) {
  llvm::StringMap<std::pair<Type, Operation *>> scalarTypes;
  llvm::StringMap<std::pair<Type, Operation *>> bufferTypes;
  llvm::StringMap<Operation *> symbols;
  WalkResult r = module.walk([&](Operation *op) -> WalkResult {
    if (auto s = dyn_cast<ScalarOp>(op)) {
      auto [it, fresh] = scalarTypes.try_emplace(s.getName(), s.getType(), op);
      if (!fresh && it->second.first != s.getType()) {
        InFlightDiagnostic d = s.emitOpError() << "scalar '" << s.getName() << "' is used as " << s.getType()
                                               << " here but as " << it->second.first << " elsewhere";
        d.attachNote(it->second.second->getLoc()) << "first used here";
        return WalkResult::interrupt();
      }
      if (bufferTypes.count(s.getName())) {
        s.emitOpError() << "'" << s.getName() << "' names both a scalar and a captured buffer";
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    }
    if (!isa<ScoreModOp, MaskModOp>(op)) return WalkResult::advance();
    StringRef sym = cast<SymbolOpInterface>(op).getName();
    auto [sit, freshSym] = symbols.try_emplace(sym, op);
    if (!freshSym) {
      op->emitOpError() << "redefines symbol @" << sym;
      return WalkResult::interrupt();
    }
    Block &entry = op->getRegion(0).front();
    auto names = op->getAttrOfType<ArrayAttr>("capture_names");
    unsigned fixed = entry.getNumArguments() - names.size();
    for (auto [i, n] : llvm::enumerate(names)) {
      StringRef name = cast<StringAttr>(n).getValue();
      Type t = entry.getArgument(fixed + i).getType();
      auto [it, fresh] = bufferTypes.try_emplace(name, t, op);
      if (!fresh && it->second.first != t) {
        op->emitOpError() << "captures '" << name << "' as " << t << " but another mod captures it as "
                          << it->second.first;
        return WalkResult::interrupt();
      }
      if (scalarTypes.count(name)) {
        op->emitOpError() << "'" << name << "' names both a scalar and a captured buffer";
        return WalkResult::interrupt();
      }
    }
    return WalkResult::advance();
  });
  return failure(r.wasInterrupted());
}

namespace {
struct FAAnnotateDepsPass : public mlir::fa::impl::FAAnnotateDepsBase<FAAnnotateDepsPass> {
  void runOnOperation() override {
    if (failed(verifyFAModule(getOperation()))) return signalPassFailure();
    Builder b(&getContext());
    getOperation().walk([&](Operation *op) {
      if (!isa<ScoreModOp, MaskModOp>(op)) return;
      ModUses u = computeUses(op);
      SmallVector<Attribute> list;
      auto add = [&](bool used, StringRef name) {
        if (used) list.push_back(b.getStringAttr(name));
      };
      add(u.score, "score");
      add(u.b, "b");
      add(u.h, "h");
      add(u.q, "q");
      add(u.kv, "kv");
      for (auto &n : u.buffers) list.push_back(b.getStringAttr("@" + n));
      for (auto &n : u.scalars) list.push_back(b.getStringAttr("$" + n));
      op->setAttr("fa.uses", b.getArrayAttr(list));
    });
  }
};
}  // namespace
