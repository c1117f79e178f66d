// RUN: fajit-opt %s | fajit-opt | FileCheck %s
// RUN: fajit-opt %s --mlir-print-op-generic | fajit-opt | FileCheck %s
// RUN: fajit-opt %s --mlir-print-op-generic | fajit-opt --mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC

// Every fa op and the buffer type, printed, parsed again and printed again. The second RUN
// line goes through the generic form, which must carry the same information (the capture
// names live in `capture_names`, the result type in `result_type`).

// The fixed arguments print under their own names, whatever the source called them.
// CHECK-LABEL: fa.score_mod @identity(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
// CHECK-NEXT:    fa.yield %score : f32
// CHECK-NEXT:  }
fa.score_mod @identity(%s: f32, %bb: i32, %hh: i32, %qq: i32, %kk: i32) -> f32 {
  fa.yield %s : f32
}

// CHECK-LABEL: fa.score_mod @alibi(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) captures(%slopes: !fa.buffer<f32, 1>) -> f32 {
// CHECK-NEXT:    %[[D:.+]] = arith.subi %kv, %q : i32
// CHECK-NEXT:    %[[DF:.+]] = arith.sitofp %[[D]] : i32 to f32
// CHECK-NEXT:    %[[S:.+]] = fa.load %slopes[%h] : !fa.buffer<f32, 1>
// CHECK-NEXT:    %[[M:.+]] = arith.mulf %[[DF]], %[[S]] : f32
// CHECK-NEXT:    %[[R:.+]] = arith.addf %score, %[[M]] : f32
// CHECK-NEXT:    fa.yield %[[R]] : f32
// CHECK-NEXT:  }
fa.score_mod @alibi(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%slopes: !fa.buffer<f32, 1>) -> f32 {
  %d = arith.subi %kv, %q : i32
  %df = arith.sitofp %d : i32 to f32
  %s = fa.load %slopes[%h] : !fa.buffer<f32, 1>
  %m = arith.mulf %df, %s : f32
  %r = arith.addf %score, %m : f32
  fa.yield %r : f32
}

// Buffers of rank 1..4, f32 and i32; the capture order is kept.
// CHECK-LABEL: fa.score_mod @ranks(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
// CHECK-SAME:    captures(%r1: !fa.buffer<f32, 1>, %r2: !fa.buffer<i32, 2>, %r3: !fa.buffer<f32, 3>, %r4: !fa.buffer<i32, 4>, %i1: !fa.buffer<i32, 1>, %f4: !fa.buffer<f32, 4>) -> f32 {
// CHECK:         fa.load %r1[%q] : !fa.buffer<f32, 1>
// CHECK:         fa.load %r2[%b, %h] : !fa.buffer<i32, 2>
// CHECK:         fa.load %r3[%b, %h, %q] : !fa.buffer<f32, 3>
// CHECK:         fa.load %r4[%b, %h, %q, %kv] : !fa.buffer<i32, 4>
// CHECK:         fa.load %i1[%kv] : !fa.buffer<i32, 1>
// CHECK:         fa.load %f4[%kv, %q, %h, %b] : !fa.buffer<f32, 4>
fa.score_mod @ranks(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%r1: !fa.buffer<f32, 1>, %r2: !fa.buffer<i32, 2>, %r3: !fa.buffer<f32, 3>,
             %r4: !fa.buffer<i32, 4>, %i1: !fa.buffer<i32, 1>, %f4: !fa.buffer<f32, 4>) -> f32 {
  %a = fa.load %r1[%q] : !fa.buffer<f32, 1>
  %bi = fa.load %r2[%b, %h] : !fa.buffer<i32, 2>
  %c = fa.load %r3[%b, %h, %q] : !fa.buffer<f32, 3>
  %di = fa.load %r4[%b, %h, %q, %kv] : !fa.buffer<i32, 4>
  %ei = fa.load %i1[%kv] : !fa.buffer<i32, 1>
  %f = fa.load %f4[%kv, %q, %h, %b] : !fa.buffer<f32, 4>
  %bd = arith.addi %bi, %di : i32
  %bde = arith.addi %bd, %ei : i32
  %bf = arith.sitofp %bde : i32 to f32
  %s0 = arith.addf %score, %a : f32
  %s1 = arith.addf %s0, %bf : f32
  %s2 = arith.addf %s1, %c : f32
  %s3 = arith.addf %s2, %f : f32
  fa.yield %s3 : f32
}

// Named runtime scalars of both types, math ops, a select.
// CHECK-LABEL: fa.score_mod @softcap(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
// CHECK-NEXT:    %[[CAP:.+]] = fa.scalar "softcap" : f32
// CHECK-NEXT:    %[[X:.+]] = arith.divf %score, %[[CAP]] : f32
// CHECK-NEXT:    %[[T:.+]] = math.tanh %[[X]] : f32
// CHECK-NEXT:    %[[Y:.+]] = arith.mulf %[[T]], %[[CAP]] : f32
// CHECK-NEXT:    %[[OFF:.+]] = fa.scalar "offset" : i32
// CHECK-NEXT:    %[[C:.+]] = arith.cmpi slt, %q, %[[OFF]] : i32
// CHECK-NEXT:    %[[R:.+]] = arith.select %[[C]], %score, %[[Y]] : f32
// CHECK-NEXT:    fa.yield %[[R]] : f32
fa.score_mod @softcap(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %cap = fa.scalar "softcap" : f32
  %x = arith.divf %score, %cap : f32
  %t = math.tanh %x : f32
  %y = arith.mulf %t, %cap : f32
  %off = fa.scalar "offset" : i32
  %c = arith.cmpi slt, %q, %off : i32
  %r = arith.select %c, %score, %y : f32
  fa.yield %r : f32
}

// CHECK-LABEL: fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
// CHECK-NEXT:    %[[C:.+]] = arith.cmpi sge, %q, %kv : i32
// CHECK-NEXT:    fa.yield %[[C]] : i1
// CHECK-NEXT:  }
fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// A mask with a scalar and a capture: sliding window inside one document.
// CHECK-LABEL: fa.mask_mod @doc_window(%b: i32, %h: i32, %q: i32, %kv: i32) captures(%doc: !fa.buffer<i32, 2>) -> i1 {
// CHECK-NEXT:    %[[W:.+]] = fa.scalar "window" : i32
// CHECK-NEXT:    %[[D:.+]] = arith.subi %q, %kv : i32
// CHECK-NEXT:    %[[IN:.+]] = arith.cmpi slt, %[[D]], %[[W]] : i32
// CHECK-NEXT:    %[[DQ:.+]] = fa.load %doc[%b, %q] : !fa.buffer<i32, 2>
// CHECK-NEXT:    %[[DK:.+]] = fa.load %doc[%b, %kv] : !fa.buffer<i32, 2>
// CHECK-NEXT:    %[[SAME:.+]] = arith.cmpi eq, %[[DQ]], %[[DK]] : i32
// CHECK-NEXT:    %[[R:.+]] = arith.andi %[[IN]], %[[SAME]] : i1
// CHECK-NEXT:    fa.yield %[[R]] : i1
fa.mask_mod @doc_window(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%doc: !fa.buffer<i32, 2>) -> i1 {
  %w = fa.scalar "window" : i32
  %d = arith.subi %q, %kv : i32
  %in = arith.cmpi slt, %d, %w : i32
  %dq = fa.load %doc[%b, %q] : !fa.buffer<i32, 2>
  %dk = fa.load %doc[%b, %kv] : !fa.buffer<i32, 2>
  %same = arith.cmpi eq, %dq, %dk : i32
  %r = arith.andi %in, %same : i1
  fa.yield %r : i1
}

// Capture names with underscores and digits keep their spelling.
// CHECK-LABEL: fa.mask_mod @names(%b: i32, %h: i32, %q: i32, %kv: i32) captures(%scores: !fa.buffer<f32, 1>, %_doc_ids2: !fa.buffer<i32, 1>) -> i1 {
// CHECK-NEXT:    %[[S:.+]] = fa.load %scores[%q] : !fa.buffer<f32, 1>
// CHECK-NEXT:    %[[D:.+]] = fa.load %_doc_ids2[%kv] : !fa.buffer<i32, 1>
fa.mask_mod @names(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%scores: !fa.buffer<f32, 1>, %_doc_ids2: !fa.buffer<i32, 1>) -> i1 {
  %s = fa.load %scores[%q] : !fa.buffer<f32, 1>
  %d = fa.load %_doc_ids2[%kv] : !fa.buffer<i32, 1>
  %df = arith.sitofp %d : i32 to f32
  %c = arith.cmpf olt, %s, %df : f32
  fa.yield %c : i1
}

// A mask that ignores everything.
// CHECK-LABEL: fa.mask_mod @full(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
// CHECK-NEXT:    %[[T:.+]] = arith.constant true
// CHECK-NEXT:    fa.yield %[[T]] : i1
fa.mask_mod @full(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %t = arith.constant true
  fa.yield %t : i1
}

// Attribute dictionaries on the mods (including the one fa-annotate-deps writes) and on
// body ops; visibility is an ordinary attribute too.
// CHECK-LABEL: fa.mask_mod @attrs(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 attributes {fa.uses = ["q", "kv"], note = "kept", weight = 3 : i64} {
// CHECK-NEXT:    %[[C:.+]] = arith.cmpi sge, %q, %kv {tag} : i32
// CHECK-NEXT:    fa.yield %[[C]] {tag = "y"} : i1
fa.mask_mod @attrs(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {fa.uses = ["q", "kv"], note = "kept", weight = 3 : i64} {
  %c = arith.cmpi sge, %q, %kv {tag = unit} : i32
  fa.yield %c {tag = "y"} : i1
}

// CHECK-LABEL: fa.score_mod @load_attrs(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) captures(%t: !fa.buffer<f32, 1>) -> f32 {
// CHECK-NEXT:    %[[L:.+]] = fa.load %t[%h] {hint = 1 : i32} : !fa.buffer<f32, 1>
// CHECK-NEXT:    %[[S:.+]] = fa.scalar "bias" {hint = 2 : i32} : f32
fa.score_mod @load_attrs(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%t: !fa.buffer<f32, 1>) -> f32 {
  %l = fa.load %t[%h] {hint = 1 : i32} : !fa.buffer<f32, 1>
  %s = fa.scalar "bias" {hint = 2 : i32} : f32
  %a = arith.addf %l, %s : f32
  %r = arith.addf %score, %a : f32
  fa.yield %r : f32
}

// The generic printer does not ask the mods for block argument names (%argN), so the
// capture names survive only through `capture_names`.
// GENERIC-LABEL: "fa.score_mod"() <{capture_names = [], result_type = f32, sym_name = "identity"}> ({
// GENERIC-NEXT:  ^bb0(%[[S:.+]]: f32, %{{.+}}: i32, %{{.+}}: i32, %{{.+}}: i32, %{{.+}}: i32):
// GENERIC-NEXT:    "fa.yield"(%[[S]]) : (f32) -> ()
// GENERIC-NEXT:  }) : () -> ()
// GENERIC-LABEL: "fa.score_mod"() <{capture_names = ["slopes"], result_type = f32, sym_name = "alibi"}> ({
// GENERIC-NEXT:  ^bb0(%{{.+}}: f32, %{{.+}}: i32, %[[H:[^:]+]]: i32, %{{.+}}: i32, %{{.+}}: i32, %[[SL:.+]]: !fa.buffer<f32, 1>):
// GENERIC:         "fa.load"(%[[SL]], %[[H]]) : (!fa.buffer<f32, 1>, i32) -> f32
// GENERIC-LABEL: "fa.score_mod"() <{capture_names = ["r1", "r2", "r3", "r4", "i1", "f4"], result_type = f32, sym_name = "ranks"}> ({
// GENERIC-NEXT:  ^bb0({{.*}}: !fa.buffer<f32, 1>, %{{.+}}: !fa.buffer<i32, 2>, %{{.+}}: !fa.buffer<f32, 3>, %{{.+}}: !fa.buffer<i32, 4>, %{{.+}}: !fa.buffer<i32, 1>, %{{.+}}: !fa.buffer<f32, 4>):
// GENERIC-LABEL: "fa.mask_mod"() <{capture_names = ["doc"], result_type = i1, sym_name = "doc_window"}> ({
// GENERIC-NEXT:  ^bb0(%{{.+}}: i32, %{{.+}}: i32, %{{.+}}: i32, %{{.+}}: i32, %{{.+}}: !fa.buffer<i32, 2>):
// GENERIC-NEXT:    "fa.scalar"() <{name = "window"}> : () -> i32
// GENERIC-LABEL: "fa.mask_mod"() <{capture_names = ["scores", "_doc_ids2"], result_type = i1, sym_name = "names"}> ({
// GENERIC-LABEL: "fa.mask_mod"() <{capture_names = [], result_type = i1, sym_name = "attrs"}> ({
// GENERIC:       }) {fa.uses = ["q", "kv"], note = "kept", weight = 3 : i64} : () -> ()
