// RUN: fajit-opt %s --canonicalize --cse | FileCheck %s

// What upstream arith/math folding and CSE do to fa bodies, and, beside each positive
// case, what they must leave alone: fa.scalar is a launch-time value (never a constant),
// fa.load reads memory whose contents are unknown at compile time, integer division by
// zero is UB that must not be folded away, and q/kv are runtime indices.

// x + 0 disappears for integers; for floats only x + -0.0 does (x + 0.0 turns -0.0 into
// +0.0, so it must stay).
// CHECK-LABEL: fa.score_mod @add_zero
// CHECK-DAG:     %[[Z:.+]] = arith.constant 0.000000e+00 : f32
// CHECK-DAG:     %[[S:.+]] = arith.sitofp %q : i32 to f32
// CHECK:         %[[A:.+]] = arith.addf %score, %[[Z]] : f32
// CHECK-NEXT:    %[[R:.+]] = arith.addf %[[A]], %[[S]] : f32
// CHECK-NEXT:    fa.yield %[[R]] : f32
fa.score_mod @add_zero(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c0 = arith.constant 0 : i32
  %z = arith.constant 0.0 : f32
  %nz = arith.constant -0.0 : f32
  %qi = arith.addi %q, %c0 : i32
  %qi2 = arith.addi %c0, %qi : i32
  %qf = arith.sitofp %qi2 : i32 to f32
  %x = arith.addf %score, %z : f32
  %x2 = arith.addf %x, %nz : f32
  %r = arith.addf %x2, %qf : f32
  fa.yield %r : f32
}

// Arithmetic that reads neither b/h/q/kv nor score is folded to constants (math too).
// CHECK-LABEL: fa.score_mod @const_fold
// CHECK-DAG:     %[[C:.+]] = arith.constant 7.000000e+00 : f32
// CHECK-DAG:     %[[E:.+]] = arith.constant 1.000000e+00 : f32
// CHECK-DAG:     %[[C12:.+]] = arith.constant 12 : i32
// CHECK-NOT:     arith.muli
// CHECK-NOT:     math.exp
// CHECK:         %[[T:.+]] = arith.addi %h, %[[C12]] : i32
// CHECK:         fa.yield
fa.score_mod @const_fold(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c3 = arith.constant 3 : i32
  %c4 = arith.constant 4 : i32
  %c12 = arith.muli %c3, %c4 : i32
  %t = arith.addi %h, %c12 : i32
  %tf = arith.sitofp %t : i32 to f32
  %f3 = arith.constant 3.0 : f32
  %f4 = arith.constant 4.0 : f32
  %f7 = arith.addf %f3, %f4 : f32
  %z = arith.constant 0.0 : f32
  %one = math.exp %z : f32
  %a = arith.mulf %score, %f7 : f32
  %a2 = arith.addf %a, %one : f32
  %a3 = arith.addf %a2, %tf : f32
  fa.yield %a3 : f32
}

// x - x is 0 even when x depends on q: that is a fact about the arithmetic, not about q.
// CHECK-LABEL: fa.mask_mod @sub_self
// CHECK-NEXT:    %[[T:.+]] = arith.constant true
// CHECK-NEXT:    fa.yield %[[T]] : i1
fa.mask_mod @sub_self(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %d = arith.subi %q, %q : i32
  %c0 = arith.constant 0 : i32
  %e = arith.cmpi eq, %d, %c0 : i32
  fa.yield %e : i1
}

// MUST NOT FOLD: a runtime scalar is not a constant, whatever arithmetic surrounds it;
// it survives canonicalization even when a constant of the same value is next to it.
// CHECK-LABEL: fa.mask_mod @scalar_kept
// CHECK-DAG:     %[[C64:.+]] = arith.constant 64 : i32
// CHECK-DAG:     %[[W:.+]] = fa.scalar "window" : i32
// CHECK:         %[[D:.+]] = arith.subi %q, %kv : i32
// CHECK-NEXT:    %[[L:.+]] = arith.cmpi slt, %[[D]], %[[W]] : i32
// CHECK-NEXT:    %[[M:.+]] = arith.cmpi slt, %[[D]], %[[C64]] : i32
// CHECK-NEXT:    %[[R:.+]] = arith.andi %[[L]], %[[M]] : i1
// CHECK-NEXT:    fa.yield %[[R]] : i1
fa.mask_mod @scalar_kept(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %w = fa.scalar "window" : i32
  %c64 = arith.constant 64 : i32
  %d = arith.subi %q, %kv : i32
  %l = arith.cmpi slt, %d, %w : i32
  %m = arith.cmpi slt, %d, %c64 : i32
  %r = arith.andi %l, %m : i1
  fa.yield %r : i1
}

// Two reads of the same scalar name are the same value: CSE merges them. Scalars of
// different names are different values and both stay.
// CHECK-LABEL: fa.score_mod @scalar_cse
// CHECK-COUNT-1: fa.scalar "cap" : f32
// CHECK-NOT:     fa.scalar "cap"
// CHECK:         fa.scalar "other_cap" : f32
// CHECK-NOT:     fa.scalar
// CHECK:         fa.yield
fa.score_mod @scalar_cse(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c1 = fa.scalar "cap" : f32
  %c2 = fa.scalar "cap" : f32
  %c3 = fa.scalar "other_cap" : f32
  %a = arith.mulf %score, %c1 : f32
  %a2 = arith.addf %a, %c2 : f32
  %a3 = arith.addf %a2, %c3 : f32
  fa.yield %a3 : f32
}

// Loads with the same buffer and indices are merged (buffers are read-only during a
// kernel); an unused load is dead code. MUST NOT FOLD: a used load stays, even with
// constant indices, and loads at different indices or from different buffers stay apart.
// CHECK-LABEL: fa.score_mod @loads
// CHECK-DAG:     %[[C1:.+]] = arith.constant 1 : i32
// CHECK-DAG:     %[[C2:.+]] = arith.constant 2 : i32
// CHECK:         %[[A:.+]] = fa.load %t[%[[C1]]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    %[[B:.+]] = fa.load %t[%[[C2]]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    %[[C:.+]] = fa.load %u[%[[C1]]] : !fa.buffer<f32, 1>
// CHECK-NEXT:    %[[S1:.+]] = arith.addf %[[A]], %[[A]] : f32
// CHECK-NEXT:    %[[S2:.+]] = arith.addf %[[S1]], %[[B]] : f32
// CHECK-NEXT:    %[[S3:.+]] = arith.addf %[[S2]], %[[C]] : f32
// CHECK-NEXT:    fa.yield %[[S3]] : f32
// CHECK-NOT:     fa.load
fa.score_mod @loads(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%t: !fa.buffer<f32, 1>, %u: !fa.buffer<f32, 1>) -> f32 {
  %c1 = arith.constant 1 : i32
  %c2 = arith.constant 2 : i32
  %c3 = arith.constant 3 : i32
  %a = fa.load %t[%c1] : !fa.buffer<f32, 1>
  %a2 = fa.load %t[%c1] : !fa.buffer<f32, 1>
  %b2 = fa.load %t[%c2] : !fa.buffer<f32, 1>
  %c = fa.load %u[%c1] : !fa.buffer<f32, 1>
  %dead = fa.load %t[%c3] : !fa.buffer<f32, 1>
  %s1 = arith.addf %a, %a2 : f32
  %s2 = arith.addf %s1, %b2 : f32
  %s3 = arith.addf %s2, %c : f32
  fa.yield %s3 : f32
}

// Loads through computed indices: the index arithmetic folds, the loads do not.
// CHECK-LABEL: fa.mask_mod @load_index_fold
// CHECK-DAG:     %[[C0:.+]] = arith.constant 0 : i32
// CHECK:         %[[DQ:.+]] = fa.load %doc[%[[C0]], %q] : !fa.buffer<i32, 2>
// CHECK-NEXT:    %[[DK:.+]] = fa.load %doc[%[[C0]], %kv] : !fa.buffer<i32, 2>
// CHECK-NEXT:    %[[E:.+]] = arith.cmpi eq, %[[DQ]], %[[DK]] : i32
// CHECK-NEXT:    fa.yield %[[E]] : i1
fa.mask_mod @load_index_fold(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%doc: !fa.buffer<i32, 2>) -> i1 {
  %c0 = arith.constant 0 : i32
  %c5 = arith.constant 5 : i32
  %row = arith.subi %c5, %c5 : i32
  %q0 = arith.addi %q, %c0 : i32
  %dq = fa.load %doc[%row, %q0] : !fa.buffer<i32, 2>
  %dk = fa.load %doc[%c0, %kv] : !fa.buffer<i32, 2>
  %e = arith.cmpi eq, %dq, %dk : i32
  fa.yield %e : i1
}

// MUST NOT FOLD: integer division and remainder by zero are UB; arith keeps them, with
// constant or runtime dividends, rather than folding them into some value.
// CHECK-LABEL: fa.score_mod @div_by_zero
// CHECK-DAG:     %[[C0:.+]] = arith.constant 0 : i32
// CHECK-DAG:     %[[C7:.+]] = arith.constant 7 : i32
// CHECK-DAG:     arith.divsi %[[C7]], %[[C0]] : i32
// CHECK-DAG:     arith.divui %[[C7]], %[[C0]] : i32
// CHECK-DAG:     arith.ceildivsi %q, %[[C0]] : i32
// CHECK-DAG:     arith.floordivsi %kv, %[[C0]] : i32
// CHECK-DAG:     arith.remsi %[[C7]], %[[C0]] : i32
// CHECK-DAG:     arith.remui %q, %[[C0]] : i32
// CHECK:         fa.yield
fa.score_mod @div_by_zero(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c0 = arith.constant 0 : i32
  %c7 = arith.constant 7 : i32
  %d0 = arith.divsi %c7, %c0 : i32
  %d1 = arith.divui %c7, %c0 : i32
  %d2 = arith.ceildivsi %q, %c0 : i32
  %d3 = arith.floordivsi %kv, %c0 : i32
  %d4 = arith.remsi %c7, %c0 : i32
  %d5 = arith.remui %q, %c0 : i32
  %s0 = arith.addi %d0, %d1 : i32
  %s1 = arith.addi %s0, %d2 : i32
  %s2 = arith.addi %s1, %d3 : i32
  %s3 = arith.addi %s2, %d4 : i32
  %s4 = arith.addi %s3, %d5 : i32
  %f = arith.sitofp %s4 : i32 to f32
  %r = arith.addf %score, %f : f32
  fa.yield %r : f32
}

// Division by a non-zero constant does fold.
// CHECK-LABEL: fa.mask_mod @div_by_const
// CHECK-DAG:     %[[C3:.+]] = arith.constant 3 : i32
// CHECK-NOT:     arith.divsi
// CHECK:         %[[E:.+]] = arith.cmpi slt, %q, %[[C3]] : i32
// CHECK-NEXT:    fa.yield %[[E]] : i1
fa.mask_mod @div_by_const(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c2 = arith.constant 2 : i32
  %c7 = arith.constant 7 : i32
  %d = arith.divsi %c7, %c2 : i32
  %e = arith.cmpi slt, %q, %d : i32
  fa.yield %e : i1
}

// q >= kv and kv <= q: arith does not rewrite a predicate to match another with swapped
// operands, so CSE merges only the literal duplicate and keeps both spellings; only a
// constant on the left is moved right (3 < q becomes q > 3), and x >= x folds to true.
// CHECK-LABEL: fa.mask_mod @cmp_swapped
// CHECK-DAG:     %[[C3:.+]] = arith.constant 3 : i32
// CHECK:         %[[A:.+]] = arith.cmpi sge, %q, %kv : i32
// CHECK-NEXT:    %[[B:.+]] = arith.cmpi sle, %kv, %q : i32
// CHECK-NEXT:    %[[C:.+]] = arith.cmpi sgt, %q, %[[C3]] : i32
// CHECK-NEXT:    %[[AB:.+]] = arith.andi %[[A]], %[[B]] : i1
// CHECK-NEXT:    %[[ABA:.+]] = arith.andi %[[AB]], %[[A]] : i1
// CHECK-NEXT:    %[[R:.+]] = arith.andi %[[ABA]], %[[C]] : i1
// CHECK-NEXT:    fa.yield %[[R]] : i1
fa.mask_mod @cmp_swapped(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c3 = arith.constant 3 : i32
  %a = arith.cmpi sge, %q, %kv : i32
  %a2 = arith.cmpi sge, %q, %kv : i32
  %bb = arith.cmpi sle, %kv, %q : i32
  %c = arith.cmpi slt, %c3, %q : i32
  %self = arith.cmpi sge, %kv, %kv : i32
  %ab = arith.andi %a, %bb : i1
  %ab2 = arith.andi %ab, %a2 : i1
  %abc = arith.andi %ab2, %c : i1
  %r = arith.andi %abc, %self : i1
  fa.yield %r : i1
}

// MUST NOT FOLD: comparisons of q/kv against constants stay, even where every real
// index would make them true (q >= 0): q is an i32 here, not a known range.
// CHECK-LABEL: fa.mask_mod @cmp_index_kept
// CHECK-DAG:     %[[C0:.+]] = arith.constant 0 : i32
// CHECK:         %[[A:.+]] = arith.cmpi sge, %q, %[[C0]] : i32
// CHECK-NEXT:    %[[B:.+]] = arith.cmpi slt, %kv, %[[C0]] : i32
// CHECK-NEXT:    %[[C:.+]] = arith.cmpi ne, %b, %h : i32
// CHECK-NEXT:    %[[AB:.+]] = arith.ori %[[A]], %[[B]] : i1
// CHECK-NEXT:    %[[R:.+]] = arith.ori %[[AB]], %[[C]] : i1
// CHECK-NEXT:    fa.yield %[[R]] : i1
fa.mask_mod @cmp_index_kept(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c0 = arith.constant 0 : i32
  %a = arith.cmpi sge, %q, %c0 : i32
  %bb = arith.cmpi slt, %kv, %c0 : i32
  %c = arith.cmpi ne, %b, %h : i32
  %ab = arith.ori %a, %bb : i1
  %r = arith.ori %ab, %c : i1
  fa.yield %r : i1
}

// The mods themselves are never removed, even unused and private-looking.
// CHECK-LABEL: fa.score_mod @unused_identity
// CHECK-NEXT:    fa.yield %score : f32
fa.score_mod @unused_identity(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  fa.yield %score : f32
}
