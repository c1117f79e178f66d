// RUN: fajit-opt %s --fa-differentiate | FileCheck %s
// RUN: fajit-opt %s --fa-differentiate | fajit-opt | FileCheck %s
// RUN: fajit-opt %s --fa-differentiate --fa-differentiate | FileCheck %s

// fa-differentiate adds an fa.score_grad after every fa.score_mod: the forward body
// recomputed, then the adjoints in reverse, canonicalized and CSE'd. The second RUN line
// round-trips the result; the third checks that a mod already differentiated is left alone.

// The derivative of each f32 op of BodyOps.def, applied to the score (unary ops) or to the
// score and an f32 buffer element (binary ops: the buffer's adjoint is its fa.grad_add).
// CHECK-LABEL: fa.score_grad @negf(
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.negf %dt : f32
// CHECK-NEXT:    fa.yield [[V0]] : f32
// CHECK-NEXT:  }
fa.score_mod @negf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = arith.negf %score : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.score_grad @exp(
// CHECK-NEXT:    [[V0:%[^ ]+]] = math.exp %score : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf %dt, [[V0]] : f32
// CHECK-NEXT:    fa.yield [[V1]] : f32
// CHECK-NEXT:  }
fa.score_mod @exp(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.exp %score : f32
  fa.yield %r : f32
}

// exp2: y ln2.
// CHECK-LABEL: fa.score_grad @exp2(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 0.693147182 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = math.exp2 %score : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf %dt, [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.mulf [[V1]], [[VCST]] : f32
// CHECK-NEXT:    fa.yield [[V2]] : f32
// CHECK-NEXT:  }
fa.score_mod @exp2(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.exp2 %score : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.score_grad @log(
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.divf %dt, %score : f32
// CHECK-NEXT:    fa.yield [[V0]] : f32
// CHECK-NEXT:  }
fa.score_mod @log(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.log %score : f32
  fa.yield %r : f32
}

// log2: 1 / (a ln2).
// CHECK-LABEL: fa.score_grad @log2(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 0.693147182 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.mulf %score, [[VCST]] : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.divf %dt, [[V0]] : f32
// CHECK-NEXT:    fa.yield [[V1]] : f32
// CHECK-NEXT:  }
fa.score_mod @log2(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.log2 %score : f32
  fa.yield %r : f32
}

// tanh: 1 - y^2.
// CHECK-LABEL: fa.score_grad @tanh(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = math.tanh %score : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf [[V0]], [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.subf [[VCST]], [[V1]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.mulf %dt, [[V2]] : f32
// CHECK-NEXT:    fa.yield [[V3]] : f32
// CHECK-NEXT:  }
fa.score_mod @tanh(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.tanh %score : f32
  fa.yield %r : f32
}

// sqrt: 1 / (2y).
// CHECK-LABEL: fa.score_grad @sqrt(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 5.000000e-01 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = math.sqrt %score : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf %dt, [[VCST]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.divf [[V1]], [[V0]] : f32
// CHECK-NEXT:    fa.yield [[V2]] : f32
// CHECK-NEXT:  }
fa.score_mod @sqrt(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.sqrt %score : f32
  fa.yield %r : f32
}

// rsqrt: -y^3 / 2.
// CHECK-LABEL: fa.score_grad @rsqrt(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant -5.000000e-01 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = math.rsqrt %score : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf [[V0]], [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.mulf [[V1]], [[V0]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.mulf %dt, [[VCST]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.mulf [[V3]], [[V2]] : f32
// CHECK-NEXT:    fa.yield [[V4]] : f32
// CHECK-NEXT:  }
fa.score_mod @rsqrt(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.rsqrt %score : f32
  fa.yield %r : f32
}

// absf: sgn(a), 0 at 0.
// CHECK-LABEL: fa.score_grad @absf(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.cmpf ogt, %score, [[VCST]] : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.cmpf olt, %score, [[VCST]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.negf %dt : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.select [[V1]], [[V2]], [[VCST]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.select [[V0]], %dt, [[V3]] : f32
// CHECK-NEXT:    fa.yield [[V4]] : f32
// CHECK-NEXT:  }
fa.score_mod @absf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.absf %score : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.score_grad @sin(
// CHECK-NEXT:    [[V0:%[^ ]+]] = math.cos %score : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf %dt, [[V0]] : f32
// CHECK-NEXT:    fa.yield [[V1]] : f32
// CHECK-NEXT:  }
fa.score_mod @sin(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.sin %score : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.score_grad @cos(
// CHECK-NEXT:    [[V0:%[^ ]+]] = math.sin %score : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf %dt, [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.negf [[V1]] : f32
// CHECK-NEXT:    fa.yield [[V2]] : f32
// CHECK-NEXT:  }
fa.score_mod @cos(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.cos %score : f32
  fa.yield %r : f32
}

// erf: (2 / sqrt(pi)) exp(-a^2).
// CHECK-LABEL: fa.score_grad @erf(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 1.12837923 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.mulf %score, %score : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.negf [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = math.exp [[V1]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.mulf [[V2]], [[VCST]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.mulf %dt, [[V3]] : f32
// CHECK-NEXT:    fa.yield [[V4]] : f32
// CHECK-NEXT:  }
fa.score_mod @erf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %r = math.erf %score : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.score_grad @addf(
// CHECK-NEXT:    fa.grad_add %w[%h], %dt : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield %dt : f32
// CHECK-NEXT:  }
fa.score_mod @addf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %r = arith.addf %score, %x : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.score_grad @subf(
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.negf %dt : f32
// CHECK-NEXT:    fa.grad_add %w[%h], [[V0]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield %dt : f32
// CHECK-NEXT:  }
fa.score_mod @subf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %r = arith.subf %score, %x : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.score_grad @mulf(
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %w[%h] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf %dt, [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.mulf %dt, %score : f32
// CHECK-NEXT:    fa.grad_add %w[%h], [[V2]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield [[V1]] : f32
// CHECK-NEXT:  }
fa.score_mod @mulf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %r = arith.mulf %score, %x : f32
  fa.yield %r : f32
}

// divf: 1/b for a, -y/b for b.
// CHECK-LABEL: fa.score_grad @divf(
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %w[%h] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.divf %score, [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.divf %dt, [[V0]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.mulf %dt, [[V1]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.divf [[V3]], [[V0]] : f32
// CHECK-NEXT:    [[V5:%[^ ]+]] = arith.negf [[V4]] : f32
// CHECK-NEXT:    fa.grad_add %w[%h], [[V5]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield [[V2]] : f32
// CHECK-NEXT:  }
fa.score_mod @divf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %r = arith.divf %score, %x : f32
  fa.yield %r : f32
}

// maximumf / minimumf: the chosen operand gets dt, a tie splits it (dt / 2 each).
// CHECK-LABEL: fa.score_grad @maximumf(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 5.000000e-01 : f32
// CHECK-NEXT:    [[VCST_0:%[^ ]+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %w[%h] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf %dt, [[VCST]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.cmpf oeq, %score, [[V0]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.select [[V2]], [[V1]], [[VCST_0]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.cmpf ogt, %score, [[V0]] : f32
// CHECK-NEXT:    [[V5:%[^ ]+]] = arith.select [[V4]], %dt, [[V3]] : f32
// CHECK-NEXT:    [[V6:%[^ ]+]] = arith.cmpf ogt, [[V0]], %score : f32
// CHECK-NEXT:    [[V7:%[^ ]+]] = arith.select [[V6]], %dt, [[V3]] : f32
// CHECK-NEXT:    fa.grad_add %w[%h], [[V7]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield [[V5]] : f32
// CHECK-NEXT:  }
fa.score_mod @maximumf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %r = arith.maximumf %score, %x : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.score_grad @minimumf(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 5.000000e-01 : f32
// CHECK-NEXT:    [[VCST_0:%[^ ]+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %w[%h] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf %dt, [[VCST]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.cmpf oeq, %score, [[V0]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.select [[V2]], [[V1]], [[VCST_0]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.cmpf olt, %score, [[V0]] : f32
// CHECK-NEXT:    [[V5:%[^ ]+]] = arith.select [[V4]], %dt, [[V3]] : f32
// CHECK-NEXT:    [[V6:%[^ ]+]] = arith.cmpf olt, [[V0]], %score : f32
// CHECK-NEXT:    [[V7:%[^ ]+]] = arith.select [[V6]], %dt, [[V3]] : f32
// CHECK-NEXT:    fa.grad_add %w[%h], [[V7]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield [[V5]] : f32
// CHECK-NEXT:  }
fa.score_mod @minimumf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %r = arith.minimumf %score, %x : f32
  fa.yield %r : f32
}

// maxnumf / minnumf: a tie goes to the first operand; a NaN second operand is not chosen, so
// the first gets the adjoint.
// CHECK-LABEL: fa.score_grad @maxnumf(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %w[%h] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.cmpf oge, %score, [[V0]] : f32
// CHECK-NEXT:    [[NAN:%[^ ]+]] = arith.cmpf uno, [[V0]], [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.select [[V1]], %dt, [[VCST]] : f32
// CHECK-NEXT:    [[GA:%[^ ]+]] = arith.select [[NAN]], %dt, [[V2]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.select [[V1]], [[VCST]], %dt : f32
// CHECK-NEXT:    [[GB:%[^ ]+]] = arith.select [[NAN]], [[VCST]], [[V3]] : f32
// CHECK-NEXT:    fa.grad_add %w[%h], [[GB]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield [[GA]] : f32
// CHECK-NEXT:  }
fa.score_mod @maxnumf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %r = arith.maxnumf %score, %x : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.score_grad @minnumf(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %w[%h] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.cmpf ole, %score, [[V0]] : f32
// CHECK-NEXT:    [[NAN:%[^ ]+]] = arith.cmpf uno, [[V0]], [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.select [[V1]], %dt, [[VCST]] : f32
// CHECK-NEXT:    [[GA:%[^ ]+]] = arith.select [[NAN]], %dt, [[V2]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.select [[V1]], [[VCST]], %dt : f32
// CHECK-NEXT:    [[GB:%[^ ]+]] = arith.select [[NAN]], [[VCST]], [[V3]] : f32
// CHECK-NEXT:    fa.grad_add %w[%h], [[GB]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield [[GA]] : f32
// CHECK-NEXT:  }
fa.score_mod @minnumf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %r = arith.minnumf %score, %x : f32
  fa.yield %r : f32
}

// powf: b a^(b-1) for a (finite at a = 0), y ln(a) for b.
// CHECK-LABEL: fa.score_grad @powf(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %w[%h] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V1:%[^ ]+]] = math.powf %score, [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.subf [[V0]], [[VCST]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = math.powf %score, [[V2]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.mulf [[V0]], [[V3]] : f32
// CHECK-NEXT:    [[V5:%[^ ]+]] = arith.mulf %dt, [[V4]] : f32
// CHECK-NEXT:    [[V6:%[^ ]+]] = math.log %score : f32
// CHECK-NEXT:    [[V7:%[^ ]+]] = arith.mulf %dt, [[V1]] : f32
// CHECK-NEXT:    [[V8:%[^ ]+]] = arith.mulf [[V7]], [[V6]] : f32
// CHECK-NEXT:    fa.grad_add %w[%h], [[V8]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield [[V5]] : f32
// CHECK-NEXT:  }
fa.score_mod @powf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %r = math.powf %score, %x : f32
  fa.yield %r : f32
}

// select: each operand gets dt where it is chosen; the condition carries no adjoint.
// CHECK-LABEL: fa.score_grad @select(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.cmpi sge, %q, %kv : i32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.select [[V0]], %dt, [[VCST]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.select [[V0]], [[VCST]], %dt : f32
// CHECK-NEXT:    fa.grad_add %w[%h], [[V2]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield [[V1]] : f32
// CHECK-NEXT:  }
fa.score_mod @select(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  %c = arith.cmpi sge, %q, %kv : i32
  %r = arith.select %c, %score, %x : f32
  fa.yield %r : f32
}

// The branch a select does not take gets a gated adjoint, exactly 0 there, and each product of
// a gated adjoint is 0 where it is: 1 / score's own derivative is inf (and its product NaN) at
// score 0, where q >= kv took the other branch and the gradient is dt (fuzz 907/42: a where's
// untaken pow(q, s) at q = 0 made dK NaN).
// CHECK-LABEL: fa.score_grad @where_untaken_pole(
// CHECK:         [[C:%[^ ]+]] = arith.cmpi sge, %q, %kv : i32
// CHECK-NEXT:    [[INV:%[^ ]+]] = arith.divf [[ONE:%[^ ]+]], %score : f32
// CHECK-NEXT:    [[GT:%[^ ]+]] = arith.select [[C]], %dt, [[Z:%[^ ]+]] : f32
// CHECK-NEXT:    [[GF:%[^ ]+]] = arith.select [[C]], [[Z]], %dt : f32
// CHECK-NEXT:    [[P:%[^ ]+]] = arith.mulf [[GF]], [[INV]] : f32
// CHECK-NEXT:    [[E:%[^ ]+]] = arith.cmpf oeq, [[GF]], [[Z]] : f32
// CHECK-NEXT:    [[G1:%[^ ]+]] = arith.select [[E]], [[Z]], [[P]] : f32
// CHECK-NEXT:    [[Q:%[^ ]+]] = arith.divf [[G1]], %score : f32
// CHECK-NEXT:    [[E2:%[^ ]+]] = arith.cmpf oeq, [[G1]], [[Z]] : f32
// CHECK-NEXT:    [[G2:%[^ ]+]] = arith.select [[E2]], [[Z]], [[Q]] : f32
// CHECK-NEXT:    [[N:%[^ ]+]] = arith.negf [[G2]] : f32
// CHECK-NEXT:    [[R:%[^ ]+]] = arith.addf [[GT]], [[N]] : f32
// CHECK-NEXT:    fa.yield [[R]] : f32
fa.score_mod @where_untaken_pole(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %one = arith.constant 1.0 : f32
  %c = arith.cmpi sge, %q, %kv : i32
  %inv = arith.divf %one, %score : f32
  %r = arith.select %c, %score, %inv : f32
  fa.yield %r : f32
}

// A compare of the score feeding a select is differentiable (piecewise).
// CHECK-LABEL: fa.score_grad @select_on_score(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.cmpf ogt, %score, [[VCST]] : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.select [[V0]], %dt, [[VCST]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.mulf [[V1]], %score : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.cmpf oeq, [[V1]], [[VCST]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.select [[V3]], [[VCST]], [[V2]] : f32
// CHECK-NEXT:    [[V5:%[^ ]+]] = arith.addf [[V4]], [[V4]] : f32
// CHECK-NEXT:    fa.yield [[V5]] : f32
// CHECK-NEXT:  }
fa.score_mod @select_on_score(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %zero = arith.constant 0.0 : f32
  %c = arith.cmpf ogt, %score, %zero : f32
  %s = arith.mulf %score, %score : f32
  %r = arith.select %c, %s, %zero : f32
  fa.yield %r : f32
}

// Integer ops and casts carry no adjoint; floor / fptosi of values that do not depend on the
// score or a float buffer are fine.
// CHECK-LABEL: fa.score_grad @casts(
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.subi %kv, %q : i32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.sitofp [[V0]] : i32 to f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = math.floor [[V1]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.fptosi [[V2]] : f32 to i32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.uitofp [[V3]] : i32 to f32
// CHECK-NEXT:    [[V5:%[^ ]+]] = arith.mulf %dt, [[V4]] : f32
// CHECK-NEXT:    fa.yield [[V5]] : f32
// CHECK-NEXT:  }
fa.score_mod @casts(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %d = arith.subi %kv, %q : i32
  %df = arith.sitofp %d : i32 to f32
  %fl = math.floor %df : f32
  %i = arith.fptosi %fl : f32 to i32
  %u = arith.uitofp %i : i32 to f32
  %m = arith.mulf %score, %u : f32
  fa.yield %m : f32
}

// A floor of the score that only feeds a compare: no adjoint flows through it.
// CHECK-LABEL: fa.score_grad @floor_only_compared(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = math.floor %score : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.cmpf oeq, [[V0]], [[VCST]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.select [[V1]], %dt, [[VCST]] : f32
// CHECK-NEXT:    fa.yield [[V2]] : f32
// CHECK-NEXT:  }
fa.score_mod @floor_only_compared(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %zero = arith.constant 0.0 : f32
  %fl = math.floor %score : f32
  %c = arith.cmpf oeq, %fl, %zero : f32
  %r = arith.select %c, %score, %zero : f32
  fa.yield %r : f32
}

// A score_mod that ignores its score: dS = 0.
// CHECK-LABEL: fa.score_grad @ignores_score(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    fa.yield [[VCST]] : f32
// CHECK-NEXT:  }
fa.score_mod @ignores_score(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %d = arith.subi %kv, %q : i32
  %df = arith.sitofp %d : i32 to f32
  fa.yield %df : f32
}

// The identity: dS = dt (codegen then keeps dS = dT).
// CHECK-LABEL: fa.score_grad @identity(
// CHECK-NEXT:    fa.yield %dt : f32
// CHECK-NEXT:  }
fa.score_mod @identity(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  fa.yield %score : f32
}

// Two reads of one buffer: one fa.grad_add per read.
// CHECK-LABEL: fa.score_grad @two_reads(
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %bias[%q] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V1:%[^ ]+]] = fa.load %bias[%kv] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.addf %score, [[V0]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.mulf %dt, [[V1]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.mulf %dt, [[V2]] : f32
// CHECK-NEXT:    fa.grad_add %bias[%kv], [[V4]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.grad_add %bias[%q], [[V3]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield [[V3]] : f32
// CHECK-NEXT:  }
fa.score_mod @two_reads(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%bias: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %bias[%q] : !fa.buffer<f32, 1>
  %y = fa.load %bias[%kv] : !fa.buffer<f32, 1>
  %s = arith.addf %score, %x : f32
  %r = arith.mulf %s, %y : f32
  fa.yield %r : f32
}

// One read used twice: the adjoints add up before the single fa.grad_add.
// CHECK-LABEL: fa.score_grad @same_read_twice(
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %bias[%q] : !fa.buffer<f32, 1>
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.mulf %dt, [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.addf [[V1]], [[V1]] : f32
// CHECK-NEXT:    fa.grad_add %bias[%q], [[V2]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield %dt : f32
// CHECK-NEXT:  }
fa.score_mod @same_read_twice(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%bias: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %bias[%q] : !fa.buffer<f32, 1>
  %s = arith.mulf %x, %x : f32
  %r = arith.addf %score, %s : f32
  fa.yield %r : f32
}

// An i32 buffer is an index, never differentiated: no fa.grad_add for it.
// CHECK-LABEL: fa.score_grad @int_buffer(
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.load %doc[%q] : !fa.buffer<i32, 1>
// CHECK-NEXT:    fa.grad_add %w[[[V0]]], %dt : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield %dt : f32
// CHECK-NEXT:  }
fa.score_mod @int_buffer(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%doc: !fa.buffer<i32, 1>, %w: !fa.buffer<f32, 1>) -> f32 {
  %d = fa.load %doc[%q] : !fa.buffer<i32, 1>
  %x = fa.load %w[%d] : !fa.buffer<f32, 1>
  %r = arith.addf %score, %x : f32
  fa.yield %r : f32
}

// Library mods (compiler/lib/frontend/mods.cpp, as traced). ALiBi from the head count:
// an additive bias, dS = dt.
// CHECK-LABEL: fa.score_grad @alibi(
// CHECK-NEXT:    fa.yield %dt : f32
// CHECK-NEXT:  }
fa.score_mod @alibi(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %cst = arith.constant -8.000000e+00 : f32
  %c1_i32 = arith.constant 1 : i32
  %0 = arith.subi %kv, %q : i32
  %1 = arith.sitofp %0 : i32 to f32
  %2 = fa.scalar "num_heads" : i32
  %3 = arith.sitofp %2 : i32 to f32
  %4 = arith.addi %h, %c1_i32 : i32
  %5 = arith.sitofp %4 : i32 to f32
  %6 = arith.mulf %5, %cst : f32
  %7 = arith.divf %6, %3 : f32
  %8 = math.exp2 %7 : f32
  %9 = arith.mulf %8, %1 : f32
  %10 = arith.addf %score, %9 : f32
  fa.yield %10 : f32
}

// ALiBi with a slopes buffer: dS = dt, d slopes[h] += dt (kv - q).
// CHECK-LABEL: fa.score_grad @alibi_slopes(
// CHECK-NEXT:    [[V0:%[^ ]+]] = arith.subi %kv, %q : i32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.sitofp [[V0]] : i32 to f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.mulf %dt, [[V1]] : f32
// CHECK-NEXT:    fa.grad_add %slopes[%h], [[V2]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield %dt : f32
// CHECK-NEXT:  }
fa.score_mod @alibi_slopes(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%slopes: !fa.buffer<f32, 1>) -> f32 {
  %0 = fa.load %slopes[%h] : !fa.buffer<f32, 1>
  %1 = arith.subi %kv, %q : i32
  %2 = arith.sitofp %1 : i32 to f32
  %3 = arith.mulf %0, %2 : f32
  %4 = arith.addf %score, %3 : f32
  fa.yield %4 : f32
}

// softcap: cap tanh(s / cap) gives dt (1 - tanh^2(s / cap)).
// CHECK-LABEL: fa.score_grad @softcap(
// CHECK-NEXT:    [[VCST:%[^ ]+]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.scalar "softcap" : f32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.divf %score, [[V0]] : f32
// CHECK-NEXT:    [[V2:%[^ ]+]] = math.tanh [[V1]] : f32
// CHECK-NEXT:    [[V3:%[^ ]+]] = arith.mulf %dt, [[V0]] : f32
// CHECK-NEXT:    [[V4:%[^ ]+]] = arith.mulf [[V2]], [[V2]] : f32
// CHECK-NEXT:    [[V5:%[^ ]+]] = arith.subf [[VCST]], [[V4]] : f32
// CHECK-NEXT:    [[V6:%[^ ]+]] = arith.mulf [[V3]], [[V5]] : f32
// CHECK-NEXT:    [[V7:%[^ ]+]] = arith.divf [[V6]], [[V0]] : f32
// CHECK-NEXT:    fa.yield [[V7]] : f32
// CHECK-NEXT:  }
fa.score_mod @softcap(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %0 = fa.scalar "softcap" : f32
  %1 = arith.divf %score, %0 : f32
  %2 = math.tanh %1 : f32
  %3 = arith.mulf %0, %2 : f32
  fa.yield %3 : f32
}

// relative bias: dS = dt, d bias[q - kv + offset] += dt.
// CHECK-LABEL: fa.score_grad @relative_bias(
// CHECK-NEXT:    [[V0:%[^ ]+]] = fa.scalar "rel_offset" : i32
// CHECK-NEXT:    [[V1:%[^ ]+]] = arith.subi %q, %kv : i32
// CHECK-NEXT:    [[V2:%[^ ]+]] = arith.addi [[V1]], [[V0]] : i32
// CHECK-NEXT:    fa.grad_add %rel_bias[[[V2]]], %dt : !fa.buffer<f32, 1>
// CHECK-NEXT:    fa.yield %dt : f32
// CHECK-NEXT:  }
fa.score_mod @relative_bias(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%rel_bias: !fa.buffer<f32, 1>) -> f32 {
  %0 = fa.scalar "rel_offset" : i32
  %1 = arith.subi %q, %kv : i32
  %2 = arith.addi %1, %0 : i32
  %3 = fa.load %rel_bias[%2] : !fa.buffer<f32, 1>
  %4 = arith.addf %score, %3 : f32
  fa.yield %4 : f32
}
