// RUN: fajit-opt %s --fa-split-index-casts | FileCheck %s

// sitofp(kv - q) becomes sitofp(kv) - sitofp(q): one conversion per column and one per row in
// a kernel's tile instead of one per element. The same float for every index below 2^24.
// CHECK-LABEL: fa.score_mod @alibi_like
// CHECK-DAG:     %[[K:.+]] = arith.sitofp %kv : i32 to f32
// CHECK-DAG:     %[[Q:.+]] = arith.sitofp %q : i32 to f32
// CHECK:         %[[D:.+]] = arith.subf %[[K]], %[[Q]] : f32
// CHECK-NOT:     arith.subi
// CHECK:         arith.mulf %[[D]], %{{.+}} : f32
fa.score_mod @alibi_like(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) captures(%slopes: !fa.buffer<f32, 1>) -> f32 {
  %d = arith.subi %kv, %q : i32
  %df = arith.sitofp %d : i32 to f32
  %slopes_h = fa.load %slopes[%h] : !fa.buffer<f32, 1>
  %t = arith.mulf %df, %slopes_h : f32
  %r = arith.addf %score, %t : f32
  fa.yield %r : f32
}

// A sum with a small constant splits too (the constant's conversion folds); the integer
// value stays for its other, integer use.
// CHECK-LABEL: fa.score_mod @sum_with_constant
// CHECK-DAG:     %[[CF:.+]] = arith.constant 3.000000e+00 : f32
// CHECK-DAG:     %[[C:.+]] = arith.constant 3 : i32
// CHECK-DAG:     %[[S:.+]] = arith.addi %q, %[[C]] : i32
// CHECK-DAG:     %[[QF:.+]] = arith.sitofp %q : i32 to f32
// CHECK:         arith.addf %[[QF]], %[[CF]] : f32
// CHECK:         fa.load %bias[%[[S]]]
fa.score_mod @sum_with_constant(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) captures(%bias: !fa.buffer<f32, 1>) -> f32 {
  %c3 = arith.constant 3 : i32
  %s = arith.addi %q, %c3 : i32
  %sf = arith.sitofp %s : i32 to f32
  %x = fa.load %bias[%s] : !fa.buffer<f32, 1>
  %t = arith.addf %sf, %x : f32
  %r = arith.addf %score, %t : f32
  fa.yield %r : f32
}

// A negative constant: kv + (-5) is kv - 5 either way.
// CHECK-LABEL: fa.score_mod @negative_constant
// CHECK-DAG:     %[[CF:.+]] = arith.constant -5.000000e+00 : f32
// CHECK-DAG:     %[[KF:.+]] = arith.sitofp %kv : i32 to f32
// CHECK:         arith.addf %[[KF]], %[[CF]] : f32
// CHECK-NOT:     arith.addi
fa.score_mod @negative_constant(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c = arith.constant -5 : i32
  %s = arith.addi %kv, %c : i32
  %sf = arith.sitofp %s : i32 to f32
  %r = arith.addf %score, %sf : f32
  fa.yield %r : f32
}

// An i1 sum wraps (true + true = false): it stays one conversion.
// CHECK-LABEL: fa.score_mod @bool_sum
// CHECK:         %[[S:.+]] = arith.addi %{{.+}}, %{{.+}} : i1
// CHECK-NEXT:    arith.sitofp %[[S]] : i1 to f32
fa.score_mod @bool_sum(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %lt = arith.cmpi slt, %q, %kv : i32
  %le = arith.cmpi sle, %q, %kv : i32
  %s = arith.addi %lt, %le : i1
  %sf = arith.sitofp %s : i1 to f32
  %r = arith.addf %score, %sf : f32
  fa.yield %r : f32
}

// What stays one conversion: a constant of 2^24 or more (not exact in f32, so the two forms
// could round differently), a runtime scalar or a loaded value (magnitude unknown), and a
// nested sum (its partial sums could round).
// CHECK-LABEL: fa.score_mod @kept
// CHECK:         %[[BIG:.+]] = arith.addi %kv, %c16777216_i32 : i32
// CHECK-NEXT:    arith.sitofp %[[BIG]] : i32 to f32
// CHECK:         %[[W:.+]] = arith.subi %q, %{{.+}} : i32
// CHECK-NEXT:    arith.sitofp %[[W]] : i32 to f32
// CHECK:         %[[L:.+]] = arith.subi %kv, %{{.+}} : i32
// CHECK-NEXT:    arith.sitofp %[[L]] : i32 to f32
// CHECK:         %[[N:.+]] = arith.addi %{{.+}}, %h : i32
// CHECK-NEXT:    arith.sitofp %[[N]] : i32 to f32
fa.score_mod @kept(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) captures(%pos: !fa.buffer<i32, 1>) -> f32 {
  %big = arith.constant 16777216 : i32
  %a = arith.addi %kv, %big : i32
  %af = arith.sitofp %a : i32 to f32
  %w = fa.scalar "w" : i32
  %bq = arith.subi %q, %w : i32
  %bf = arith.sitofp %bq : i32 to f32
  %p = fa.load %pos[%kv] : !fa.buffer<i32, 1>
  %c = arith.subi %kv, %p : i32
  %cf = arith.sitofp %c : i32 to f32
  %qk = arith.subi %q, %kv : i32
  %n = arith.addi %qk, %h : i32
  %nf = arith.sitofp %n : i32 to f32
  %t0 = arith.addf %af, %bf : f32
  %t1 = arith.addf %t0, %cf : f32
  %t2 = arith.addf %t1, %nf : f32
  %r = arith.addf %score, %t2 : f32
  fa.yield %r : f32
}

// mask_mod and score_grad bodies are split the same way.
// CHECK-LABEL: fa.mask_mod @float_band
// CHECK-DAG:     arith.sitofp %q : i32 to f32
// CHECK-DAG:     arith.sitofp %kv : i32 to f32
// CHECK-NOT:     arith.subi
fa.mask_mod @float_band(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %d = arith.subi %q, %kv : i32
  %df = arith.sitofp %d : i32 to f32
  %lim = arith.constant 8.5 : f32
  %in = arith.cmpf olt, %df, %lim : f32
  fa.yield %in : i1
}
// CHECK-LABEL: fa.score_grad @alibi_like
// CHECK-DAG:     arith.sitofp %q : i32 to f32
// CHECK-DAG:     arith.sitofp %kv : i32 to f32
// CHECK-NOT:     arith.subi
fa.score_grad @alibi_like(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32, %dt: f32) captures(%slopes: !fa.buffer<f32, 1>) -> f32 {
  %d = arith.subi %kv, %q : i32
  %df = arith.sitofp %d : i32 to f32
  %x = arith.mulf %dt, %df : f32
  fa.yield %x : f32
}
