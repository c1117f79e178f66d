#include "fajit/Dialect/FA/FAOps.h"

#include "fajit/Dialect/FA/BodyOps.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringSet.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace mlir::fa;

#include "fajit/Dialect/FA/FAInterfaces.cpp.inc"

#define GET_OP_CLASSES
#include "fajit/Dialect/FA/FAOps.cpp.inc"

namespace {

constexpr llvm::StringLiteral kScoreArgNames[] = {"score", "b", "h", "q", "kv"};
constexpr llvm::StringLiteral kMaskArgNames[] = {"b", "h", "q", "kv"};
constexpr llvm::StringLiteral kGradArgNames[] = {"score", "b", "h", "q", "kv", "dt"};

bool isIdentifier(StringRef s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return llvm::all_of(s, [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

bool isBodyType(Type t) { return t.isF32() || t.isSignlessInteger(32) || t.isSignlessInteger(1); }

//===----------------------------------------------------------------------===//
// Shared custom syntax of fa.score_mod / fa.mask_mod:
//   fa.score_mod @name(%score: f32, %b: i32, ...) captures(%buf: !fa.buffer<f32, 1>) -> f32
//       attributes {...} { body }
//===----------------------------------------------------------------------===//

// fa.score_grad shares the syntax; its @name is the score_mod it differentiates (attribute
// `mod`, a reference), not a symbol of its own.
template <typename ModOp>
ParseResult parseModOp(OpAsmParser &parser, OperationState &result) {
  StringAttr symName;
  if constexpr (std::is_same_v<ModOp, ScoreGradOp>) {
    if (parser.parseSymbolName(symName)) return failure();
    result.addAttribute(ScoreGradOp::getModAttrName(result.name), FlatSymbolRefAttr::get(symName));
  } else if (parser.parseSymbolName(symName, SymbolTable::getSymbolAttrName(), result.attributes)) {
    return failure();
  }
  SmallVector<OpAsmParser::Argument> args;
  if (parser.parseArgumentList(args, OpAsmParser::Delimiter::Paren, /*allowType=*/true)) return failure();
  SmallVector<Attribute> captureNames;
  if (succeeded(parser.parseOptionalKeyword("captures"))) {
    SmallVector<OpAsmParser::Argument> captures;
    llvm::SMLoc loc = parser.getCurrentLocation();
    if (parser.parseArgumentList(captures, OpAsmParser::Delimiter::Paren, /*allowType=*/true))
      return failure();
    for (OpAsmParser::Argument &c : captures) {
      StringRef name = c.ssaName.name.drop_front();  // drop '%'
      if (!isIdentifier(name))
        return parser.emitError(loc) << "capture '" << c.ssaName.name << "' needs an identifier as its name";
      captureNames.push_back(parser.getBuilder().getStringAttr(name));
      args.push_back(c);
    }
  }
  Type resultType;
  if (parser.parseArrow() || parser.parseType(resultType)) return failure();
  if (parser.parseOptionalAttrDictWithKeyword(result.attributes)) return failure();
  result.addAttribute(ModOp::getResultTypeAttrName(result.name), TypeAttr::get(resultType));
  result.addAttribute(ModOp::getCaptureNamesAttrName(result.name),
                      parser.getBuilder().getArrayAttr(captureNames));
  Region *body = result.addRegion();
  return parser.parseRegion(*body, args);
}

template <typename ModOp>
void printModOp(ModOp op, OpAsmPrinter &p) {
  p << ' ';
  p.printSymbolName(op.getSymName());
  Block &entry = op.getBody().front();
  unsigned fixed = std::min<unsigned>(ModOp::getNumFixedArgs(), entry.getNumArguments());
  p << '(';
  llvm::interleaveComma(entry.getArguments().take_front(fixed), p,
                        [&](BlockArgument a) { p.printRegionArgument(a); });
  p << ')';
  if (entry.getNumArguments() > fixed) {
    p << " captures(";
    llvm::interleaveComma(entry.getArguments().drop_front(fixed), p,
                          [&](BlockArgument a) { p.printRegionArgument(a); });
    p << ')';
  }
  p << " -> " << op.getResultType();
  StringRef nameAttr;
  if constexpr (std::is_same_v<ModOp, ScoreGradOp>)
    nameAttr = op.getModAttrName().getValue();
  else
    nameAttr = SymbolTable::getSymbolAttrName();
  p.printOptionalAttrDictWithKeyword(op->getAttrs(),
                                     {nameAttr, op.getResultTypeAttrName(), op.getCaptureNamesAttrName()});
  p << ' ';
  p.printRegion(op.getBody(), /*printEntryBlockArgs=*/false, /*printBlockTerminators=*/true);
}

template <typename ModOp>
void nameBlockArgs(ModOp op, Region &region, OpAsmSetValueNameFn setNameFn,
                   ArrayRef<llvm::StringLiteral> fixedNames) {
  if (region.empty()) return;
  Block &entry = region.front();
  for (auto [i, arg] : llvm::enumerate(entry.getArguments())) {
    if (i < fixedNames.size())
      setNameFn(arg, fixedNames[i]);
    else if (i - fixedNames.size() < op.getCaptureNames().size())
      setNameFn(arg, op.getCaptureName(i - fixedNames.size()));
  }
}

/// The checks both mod ops share: signature, captures, and what the body may contain.
template <typename ModOp>
LogicalResult verifyModOp(ModOp op, ArrayRef<llvm::StringLiteral> fixedNames, ArrayRef<Type> fixedTypes,
                          Type expectedResult) {
  StringRef opName = op->getName().getStringRef();
  if (op.getResultType() != expectedResult)
    return op.emitOpError() << "must return " << expectedResult << ", not " << op.getResultType();
  Block &entry = op.getBody().front();
  unsigned fixed = fixedNames.size();
  if (entry.getNumArguments() < fixed) {
    std::string sig;
    llvm::raw_string_ostream os(sig);
    llvm::interleaveComma(llvm::zip(fixedNames, fixedTypes), os,
                          [&](auto nt) { os << std::get<0>(nt) << ": " << std::get<1>(nt); });
    return op.emitOpError() << "expects arguments (" << sig << "), got " << entry.getNumArguments()
                            << " arguments";
  }
  for (unsigned i = 0; i < fixed; ++i)
    if (entry.getArgument(i).getType() != fixedTypes[i])
      return op.emitOpError() << "argument #" << i << " ('" << fixedNames[i] << "') must be " << fixedTypes[i]
                              << ", got " << entry.getArgument(i).getType();
  auto captures = entry.getArguments().drop_front(fixed);
  if (captures.size() != op.getCaptureNames().size())
    return op.emitOpError() << "has " << captures.size() << " captures but " << op.getCaptureNames().size()
                            << " capture names";
  llvm::StringSet<> seen;
  for (auto [i, c] : llvm::enumerate(captures)) {
    StringRef name = op.getCaptureName(i);
    if (!isIdentifier(name)) return op.emitOpError() << "capture name '" << name << "' must be an identifier";
    if (!seen.insert(name).second) return op.emitOpError() << "captures '" << name << "' twice";
    if (llvm::is_contained(kScoreArgNames, name))
      return op.emitOpError() << "capture name '" << name
                              << "' is reserved (score, b, h, q and kv name the fixed arguments)";
    if (llvm::is_contained(fixedNames, name))
      return op.emitOpError() << "capture name '" << name << "' is reserved (it names a fixed argument)";
    if (!llvm::isa<BufferType>(c.getType()))
      return op.emitOpError() << "capture '" << name << "' must be a !fa.buffer, got " << c.getType();
  }
  constexpr bool kIsGrad = std::is_same_v<ModOp, ScoreGradOp>;
  for (Operation &inner : entry) {
    if (kIsGrad && isa<GradAddOp>(inner)) continue;  // verified on its own; writes by design
    if (!isSupportedBodyOp(&inner))
      return inner.emitOpError() << "is not supported in a " << opName
                                 << " body (allowed: pure arith and math ops on i1/i32/f32, "
                                    "fa.load, fa.scalar, fa.yield"
                                 << (kIsGrad ? ", fa.grad_add)" : ")");
    if (!isMemoryEffectFree(&inner))
      return inner.emitOpError() << "has side effects; " << opName << " bodies must be pure";
    if (isa<arith::FPToSIOp, arith::FPToUIOp>(inner) && inner.getResult(0).getType().isSignlessInteger(1))
      return inner.emitOpError() << "converts a float to i1; compare the float instead";
    for (Type t : inner.getResultTypes())
      if (!isBodyType(t))
        return inner.emitOpError() << "produces unsupported type " << t << "; " << opName
                                   << " bodies compute on i1, i32 and f32";
    for (Value v : inner.getOperands())
      if (!isBodyType(v.getType()) && !llvm::isa<BufferType>(v.getType()))
        return inner.emitOpError() << "uses unsupported type " << v.getType() << "; " << opName
                                   << " bodies compute on i1, i32 and f32";
  }
  return success();
}

}  // namespace

//===----------------------------------------------------------------------===//
// Supported body ops: the table of BodyOps.def, plus the leaves and the terminator.
//===----------------------------------------------------------------------===//

bool mlir::fa::isSupportedBodyOp(Operation *op) {
  if (op->getNumRegions() != 0) return false;
  return isa<ScalarOp, YieldOp, arith::ConstantOp>(op) || getBodyOp(op).has_value();
}

//===----------------------------------------------------------------------===//
// ScoreModOp / MaskModOp
//===----------------------------------------------------------------------===//

unsigned ScoreModOp::getNumFixedArgs() { return std::size(kScoreArgNames); }
unsigned MaskModOp::getNumFixedArgs() { return std::size(kMaskArgNames); }
unsigned ScoreGradOp::getNumFixedArgs() { return std::size(kGradArgNames); }
llvm::StringRef ScoreModOp::getFixedArgName(unsigned i) { return kScoreArgNames[i]; }
llvm::StringRef MaskModOp::getFixedArgName(unsigned i) { return kMaskArgNames[i]; }
llvm::StringRef ScoreGradOp::getFixedArgName(unsigned i) { return kGradArgNames[i]; }

ParseResult ScoreModOp::parse(OpAsmParser &parser, OperationState &result) {
  return parseModOp<ScoreModOp>(parser, result);
}
void ScoreModOp::print(OpAsmPrinter &p) { printModOp(*this, p); }
ParseResult MaskModOp::parse(OpAsmParser &parser, OperationState &result) {
  return parseModOp<MaskModOp>(parser, result);
}
void MaskModOp::print(OpAsmPrinter &p) { printModOp(*this, p); }
ParseResult ScoreGradOp::parse(OpAsmParser &parser, OperationState &result) {
  return parseModOp<ScoreGradOp>(parser, result);
}
void ScoreGradOp::print(OpAsmPrinter &p) { printModOp(*this, p); }

void ScoreModOp::getAsmBlockArgumentNames(Region &region, OpAsmSetValueNameFn setNameFn) {
  nameBlockArgs(*this, region, setNameFn, kScoreArgNames);
}
void MaskModOp::getAsmBlockArgumentNames(Region &region, OpAsmSetValueNameFn setNameFn) {
  nameBlockArgs(*this, region, setNameFn, kMaskArgNames);
}
void ScoreGradOp::getAsmBlockArgumentNames(Region &region, OpAsmSetValueNameFn setNameFn) {
  nameBlockArgs(*this, region, setNameFn, kGradArgNames);
}

LogicalResult ScoreModOp::verifyRegions() {
  Builder b(getContext());
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  return verifyModOp(*this, kScoreArgNames, {f32, i32, i32, i32, i32}, f32);
}

LogicalResult ScoreGradOp::verifyRegions() {
  Builder b(getContext());
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  return verifyModOp(*this, kGradArgNames, {f32, i32, i32, i32, i32, f32}, f32);
}

LogicalResult MaskModOp::verifyRegions() {
  Builder b(getContext());
  Type i32 = b.getI32Type();
  return verifyModOp(*this, kMaskArgNames, {i32, i32, i32, i32}, b.getI1Type());
}

//===----------------------------------------------------------------------===//
// LoadOp / ScalarOp / YieldOp
//===----------------------------------------------------------------------===//

LogicalResult LoadOp::verify() {
  unsigned rank = getBuffer().getType().getRank();
  if (getIndices().size() != rank)
    return emitOpError() << "expects " << rank << (rank == 1 ? " index" : " indices") << " for a rank-"
                         << rank << " buffer, got " << getIndices().size();
  return success();
}

LogicalResult GradAddOp::verify() {
  BufferType type = getBuffer().getType();
  if (!type.getElementType().isF32())
    return emitOpError() << "needs an f32 buffer: " << type << " has no gradient";
  unsigned rank = type.getRank();
  if (getIndices().size() != rank)
    return emitOpError() << "expects " << rank << (rank == 1 ? " index" : " indices") << " for a rank-"
                         << rank << " buffer, got " << getIndices().size();
  return success();
}

LogicalResult ScalarOp::verify() {
  if (!isIdentifier(getName())) return emitOpError() << "name '" << getName() << "' must be an identifier";
  return success();
}

LogicalResult YieldOp::verify() {
  Operation *parent = (*this)->getParentOp();
  Type expected = isa<ScoreModOp>(parent)    ? cast<ScoreModOp>(parent).getResultType()
                  : isa<ScoreGradOp>(parent) ? cast<ScoreGradOp>(parent).getResultType()
                                             : cast<MaskModOp>(parent).getResultType();
  if (getValue().getType() != expected)
    return emitOpError() << "yields " << getValue().getType() << " but '" << parent->getName() << "' returns "
                         << expected;
  return success();
}
