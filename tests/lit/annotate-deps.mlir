// RUN: fajit-opt %s --fa-annotate-deps | FileCheck %s
// RUN: fajit-opt %s --canonicalize --fa-annotate-deps | FileCheck %s --check-prefix=SIMPLIFIED

// fa.uses lists the fixed arguments a body reads (in the order score, b, h, q, kv), then
// `@name` for each captured buffer it reads (capture order), then `$name` for each runtime
// scalar (sorted, each once). The pass reads the body as it is; run --canonicalize first
// to drop dead reads (second RUN line).

// A score_mod that ignores its score reads nothing of it: no "score" in the list.
// CHECK-LABEL: fa.score_mod @ignores_score
// CHECK-SAME:    attributes {fa.uses = ["q", "kv"]}
fa.score_mod @ignores_score(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %d = arith.subi %q, %kv : i32
  %f = arith.sitofp %d : i32 to f32
  fa.yield %f : f32
}

// The identity score_mod reads only its score.
// CHECK-LABEL: fa.score_mod @identity
// CHECK-SAME:    attributes {fa.uses = ["score"]}
fa.score_mod @identity(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  fa.yield %score : f32
}

// A constant score_mod reads nothing at all.
// CHECK-LABEL: fa.score_mod @constant
// CHECK-SAME:    attributes {fa.uses = []}
fa.score_mod @constant(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c = arith.constant 1.0 : f32
  fa.yield %c : f32
}

// ALiBi: h through a buffer, plus q and kv.
// CHECK-LABEL: fa.score_mod @alibi
// CHECK-SAME:    attributes {fa.uses = ["score", "h", "q", "kv", "@slopes"]}
fa.score_mod @alibi(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%slopes: !fa.buffer<f32, 1>) -> f32 {
  %d = arith.subi %kv, %q : i32
  %df = arith.sitofp %d : i32 to f32
  %s = fa.load %slopes[%h] : !fa.buffer<f32, 1>
  %m = arith.mulf %df, %s : f32
  %r = arith.addf %score, %m : f32
  fa.yield %r : f32
}

// Causal mask: q and kv only, so block masks can be built with B = H = 1.
// CHECK-LABEL: fa.mask_mod @causal
// CHECK-SAME:    attributes {fa.uses = ["q", "kv"]}
fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// A mask reading b (through a buffer index) and a scalar.
// CHECK-LABEL: fa.mask_mod @doc_window
// CHECK-SAME:    attributes {fa.uses = ["b", "q", "kv", "@doc", "$window"]}
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

// A mask reading h only (per-head masking), and a mask reading b and h.
// CHECK-LABEL: fa.mask_mod @head_only
// CHECK-SAME:    attributes {fa.uses = ["h"]}
fa.mask_mod @head_only(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c2 = arith.constant 2 : i32
  %c = arith.cmpi slt, %h, %c2 : i32
  fa.yield %c : i1
}
// CHECK-LABEL: fa.mask_mod @batch_head
// CHECK-SAME:    attributes {fa.uses = ["b", "h"]}
fa.mask_mod @batch_head(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = arith.cmpi eq, %b, %h : i32
  fa.yield %c : i1
}

// Buffers in capture order; an unread capture is not listed. Scalars sorted by name, once
// each, whatever the order and number of reads.
// CHECK-LABEL: fa.score_mod @many
// CHECK-SAME:    attributes {fa.uses = ["score", "b", "h", "q", "kv", "@first", "@third", "$alpha", "$zeta"]}
fa.score_mod @many(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%first: !fa.buffer<f32, 4>, %unread: !fa.buffer<f32, 1>,
             %third: !fa.buffer<i32, 1>) -> f32 {
  %z = fa.scalar "zeta" : f32
  %a = fa.scalar "alpha" : f32
  %z2 = fa.scalar "zeta" : f32
  %x = fa.load %first[%b, %h, %q, %kv] : !fa.buffer<f32, 4>
  %i = fa.load %third[%q] : !fa.buffer<i32, 1>
  %if = arith.sitofp %i : i32 to f32
  %s0 = arith.addf %score, %x : f32
  %s1 = arith.addf %s0, %if : f32
  %s2 = arith.mulf %s1, %z : f32
  %s3 = arith.addf %s2, %a : f32
  %s4 = arith.addf %s3, %z2 : f32
  fa.yield %s4 : f32
}

// Dead reads: without simplification the pass counts every read in the body (b, the
// buffer and the scalar below are read by ops whose results are unused); after
// --canonicalize they are gone.
// CHECK-LABEL: fa.mask_mod @dead_reads
// CHECK-SAME:    attributes {fa.uses = ["b", "q", "kv", "@ids", "$unused"]}
// SIMPLIFIED-LABEL: fa.mask_mod @dead_reads
// SIMPLIFIED-SAME:    attributes {fa.uses = ["q", "kv"]}
fa.mask_mod @dead_reads(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%ids: !fa.buffer<i32, 1>) -> i1 {
  %dead = fa.load %ids[%b] : !fa.buffer<i32, 1>
  %s = fa.scalar "unused" : i32
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// A read of h that folds away (h - h) is not a dependence once simplified.
// CHECK-LABEL: fa.mask_mod @folded_head
// CHECK-SAME:    attributes {fa.uses = ["h", "q"]}
// SIMPLIFIED-LABEL: fa.mask_mod @folded_head
// SIMPLIFIED-SAME:    attributes {fa.uses = ["q"]}
fa.mask_mod @folded_head(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %z = arith.subi %h, %h : i32
  %c = arith.cmpi sge, %q, %z : i32
  fa.yield %c : i1
}

// The attribute is replaced, not appended to, when the pass runs on annotated input;
// other attributes stay.
// CHECK-LABEL: fa.mask_mod @reannotated
// CHECK-SAME:    attributes {fa.uses = ["q"], keep = 1 : i32}
fa.mask_mod @reannotated(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {fa.uses = ["b", "h", "q", "kv", "@gone"], keep = 1 : i32} {
  %c0 = arith.constant 0 : i32
  %c = arith.cmpi sgt, %q, %c0 : i32
  fa.yield %c : i1
}

// The same scalar and the same buffer (same type) in two mods are fine.
// CHECK-LABEL: fa.score_mod @shared_a
// CHECK-SAME:    attributes {fa.uses = ["score", "h", "@bias", "$scale"]}
// CHECK-LABEL: fa.mask_mod @shared_b
// CHECK-SAME:    attributes {fa.uses = ["h", "@bias", "$scale"]}
fa.score_mod @shared_a(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%bias: !fa.buffer<f32, 1>) -> f32 {
  %s = fa.scalar "scale" : f32
  %x = fa.load %bias[%h] : !fa.buffer<f32, 1>
  %m = arith.mulf %x, %s : f32
  %r = arith.addf %score, %m : f32
  fa.yield %r : f32
}
fa.mask_mod @shared_b(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%bias: !fa.buffer<f32, 1>) -> i1 {
  %s = fa.scalar "scale" : f32
  %x = fa.load %bias[%h] : !fa.buffer<f32, 1>
  %c = arith.cmpf olt, %x, %s : f32
  fa.yield %c : i1
}
