// The interval domain: comparisons (the rest is inline in the header).
#include "fajit/analysis/interval.h"

#include "mlir/Dialect/Arith/IR/Arith.h"

namespace fa::detail {

AVal cmpi(uint8_t pred, AVal a, AVal b, unsigned w) {
  using P = mlir::arith::CmpIPredicate;
  P p = static_cast<P>(pred);
  bool is_unsigned = p == P::ult || p == P::ule || p == P::ugt || p == P::uge;
  if (is_unsigned) {
    a = uns(a, w);
    b = uns(b, w);
  } else {
    a = sgn(a, w);
    b = sgn(b, w);
  }
  switch (p) {
    case P::eq: return tri(!(single(a) && single(b) && a.lo == b.lo), !(a.hi < b.lo || b.hi < a.lo));
    case P::ne: return tri(!(a.hi < b.lo || b.hi < a.lo), !(single(a) && single(b) && a.lo == b.lo));
    case P::slt:
    case P::ult: return tri(a.hi >= b.lo, a.lo < b.hi);
    case P::sle:
    case P::ule: return tri(a.hi > b.lo, a.lo <= b.hi);
    case P::sgt:
    case P::ugt: return tri(a.lo <= b.hi, a.hi > b.lo);
    case P::sge:
    case P::uge: return tri(a.lo < b.hi, a.hi >= b.lo);
  }
  return itop(1);
}

AVal cmpf(uint8_t pred, const AVal& a, const AVal& b) {
  using P = mlir::arith::CmpFPredicate;
  P p = static_cast<P>(pred);
  if (p == P::AlwaysFalse) return tri(true, false);
  if (p == P::AlwaysTrue) return tri(false, true);
  if (a.nan || b.nan) return itop(1);
  switch (p) {
    case P::OEQ:
    case P::UEQ:
      return tri(!(a.flo == a.fhi && b.flo == b.fhi && a.flo == b.flo), !(a.fhi < b.flo || b.fhi < a.flo));
    case P::ONE:
    case P::UNE:
      return tri(!(a.fhi < b.flo || b.fhi < a.flo), !(a.flo == a.fhi && b.flo == b.fhi && a.flo == b.flo));
    case P::OLT:
    case P::ULT: return tri(!(a.fhi < b.flo), a.flo < b.fhi);
    case P::OLE:
    case P::ULE: return tri(!(a.fhi <= b.flo), a.flo <= b.fhi);
    case P::OGT:
    case P::UGT: return tri(!(a.flo > b.fhi), a.fhi > b.flo);
    case P::OGE:
    case P::UGE: return tri(!(a.flo >= b.fhi), a.fhi >= b.flo);
    case P::ORD: return tri(false, true);
    case P::UNO: return tri(true, false);
    default: return itop(1);
  }
}

}  // namespace fa::detail
