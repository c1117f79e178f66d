// RUN: fajit-opt %s --split-input-file --fa-mask-block-range="q0=256 q1=383 k0=0 k1=127 scalars=window=1000,prefix=64,n_pad=100" | FileCheck %s --check-prefix=BELOW
// RUN: fajit-opt %s --split-input-file --fa-mask-block-range="q0=0 q1=127 k0=128 k1=255 scalars=window=1000,prefix=64,n_pad=100" | FileCheck %s --check-prefix=ABOVE
// RUN: fajit-opt %s --split-input-file --fa-mask-block-range="q0=128 q1=255 k0=128 k1=255 scalars=window=1000,prefix=64,n_pad=100" | FileCheck %s --check-prefix=DIAG
// RUN: fajit-opt %s --split-input-file --fa-mask-block-range="q0=256 q1=383 k0=0 k1=127" | FileCheck %s --check-prefix=UNBOUND

// fa-mask-block-range: the value of each mask_mod over one block (q in [q0, q1], kv in
// [k0, k1]) from MLIR's integer range analysis, with the given runtime scalars bound:
// "full" (true on every element), "empty" (false on every element) or "partial?" (the
// analysis cannot tell; only full and empty are claims).

// BELOW-LABEL: fa.mask_mod @causal
// BELOW-SAME:    fa.block = "full"
// ABOVE-LABEL: fa.mask_mod @causal
// ABOVE-SAME:    fa.block = "empty"
// DIAG-LABEL:  fa.mask_mod @causal
// DIAG-SAME:     fa.block = "partial?"
fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// -----

// Sliding window: q - kv in [129, 383] over the block below the diagonal, inside the window
// of 1000; unbound, the window could be anything.
// BELOW-LABEL: fa.mask_mod @sliding
// BELOW-SAME:    fa.block = "full"
// ABOVE-LABEL: fa.mask_mod @sliding
// ABOVE-SAME:    fa.block = "empty"
// UNBOUND-LABEL: fa.mask_mod @sliding
// UNBOUND-SAME:    fa.block = "partial?"
fa.mask_mod @sliding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %w = fa.scalar "window" : i32
  %c = arith.cmpi sge, %q, %kv : i32
  %d = arith.subi %q, %kv : i32
  %in = arith.cmpi sle, %d, %w : i32
  %r = arith.andi %c, %in : i1
  fa.yield %r : i1
}

// -----

// Prefix LM with prefix 64: kv in [128, 255] is past the prefix and above the diagonal.
// ABOVE-LABEL: fa.mask_mod @prefix_lm
// ABOVE-SAME:    fa.block = "empty"
// DIAG-LABEL:  fa.mask_mod @prefix_lm
// DIAG-SAME:     fa.block = "partial?"
fa.mask_mod @prefix_lm(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %p = fa.scalar "prefix" : i32
  %in = arith.cmpi slt, %kv, %p : i32
  %c = arith.cmpi sge, %q, %kv : i32
  %r = arith.ori %in, %c : i1
  fa.yield %r : i1
}

// -----

// Padding of 100: the block q in [256, 383], kv in [0, 127] straddles kv = 100.
// BELOW-LABEL: fa.mask_mod @padding
// BELOW-SAME:    fa.block = "partial?"
// DIAG-LABEL:  fa.mask_mod @padding
// DIAG-SAME:     fa.block = "full"
fa.mask_mod @padding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %n = fa.scalar "n_pad" : i32
  %a = arith.cmpi sge, %q, %n : i32
  %k = arith.cmpi sge, %kv, %n : i32
  %r = arith.andi %a, %k : i1
  fa.yield %r : i1
}

// -----

// Must not decide: a value read from a buffer is unknown, whatever the block.
// BELOW-LABEL: fa.mask_mod @document
// BELOW-SAME:    fa.block = "partial?"
// ABOVE-LABEL: fa.mask_mod @document
// ABOVE-SAME:    fa.block = "partial?"
fa.mask_mod @document(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%doc_ids: !fa.buffer<i32, 1>) -> i1 {
  %dq = fa.load %doc_ids[%q] : !fa.buffer<i32, 1>
  %dk = fa.load %doc_ids[%kv] : !fa.buffer<i32, 1>
  %r = arith.cmpi eq, %dq, %dk : i32
  fa.yield %r : i1
}

// -----

// ... but with causal and-ed in, the block above the diagonal is empty anyway.
// ABOVE-LABEL: fa.mask_mod @causal_document
// ABOVE-SAME:    fa.block = "empty"
fa.mask_mod @causal_document(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%doc_ids: !fa.buffer<i32, 1>) -> i1 {
  %dq = fa.load %doc_ids[%q] : !fa.buffer<i32, 1>
  %dk = fa.load %doc_ids[%kv] : !fa.buffer<i32, 1>
  %s = arith.cmpi eq, %dq, %dk : i32
  %c = arith.cmpi sge, %q, %kv : i32
  %r = arith.andi %s, %c : i1
  fa.yield %r : i1
}

// -----

// Must not decide: q * 2^30 may wrap around in i32, so the range analysis widens.
// BELOW-LABEL: fa.mask_mod @wraps
// BELOW-SAME:    fa.block = "partial?"
fa.mask_mod @wraps(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %big = arith.constant 1073741824 : i32
  %m = arith.muli %q, %big : i32
  %z = arith.constant 0 : i32
  %r = arith.cmpi sge, %m, %z : i32
  fa.yield %r : i1
}
