// RUN: fajit-opt %s --split-input-file --verify-diagnostics --fa-annotate-deps
//
// One case per diagnostic of the fa dialect: the op and type verifiers (which fire while
// parsing, before any pass) and the module-level checks of --fa-annotate-deps (the last
// cases, which are valid to the verifier).

//===----------------------------------------------------------------------===//
// Mod signatures
//===----------------------------------------------------------------------===//

// expected-error @+1 {{'fa.score_mod' op must return 'f32', not 'i1'}}
fa.score_mod @bad_result(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = arith.constant true
  fa.yield %c : i1
}

// -----

// expected-error @+1 {{'fa.mask_mod' op must return 'i1', not 'f32'}}
fa.mask_mod @bad_result(%b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c = arith.constant 1.0 : f32
  fa.yield %c : f32
}

// -----

// expected-error @+1 {{'fa.score_mod' op expects arguments (score: f32, b: i32, h: i32, q: i32, kv: i32), got 4 arguments}}
fa.score_mod @too_few(%b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c = arith.constant 1.0 : f32
  fa.yield %c : f32
}

// -----

// expected-error @+1 {{'fa.mask_mod' op expects arguments (b: i32, h: i32, q: i32, kv: i32), got 3 arguments}}
fa.mask_mod @too_few(%h: i32, %q: i32, %kv: i32) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// -----

// An extra fixed-looking argument is a capture that is not a buffer.
// expected-error @+1 {{'fa.mask_mod' op has 1 captures but 0 capture names}}
fa.mask_mod @too_many(%b: i32, %h: i32, %q: i32, %kv: i32, %x: i32) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// -----

// expected-error @+1 {{'fa.score_mod' op argument #0 ('score') must be 'f32', got 'i32'}}
fa.score_mod @bad_score(%score: i32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c = arith.constant 1.0 : f32
  fa.yield %c : f32
}

// -----

// expected-error @+1 {{'fa.score_mod' op argument #4 ('kv') must be 'i32', got 'f32'}}
fa.score_mod @bad_kv(%score: f32, %b: i32, %h: i32, %q: i32, %kv: f32) -> f32 {
  fa.yield %score : f32
}

// -----

// expected-error @+1 {{'fa.mask_mod' op argument #1 ('h') must be 'i32', got 'i1'}}
fa.mask_mod @bad_h(%b: i32, %h: i1, %q: i32, %kv: i32) -> i1 {
  fa.yield %h : i1
}

//===----------------------------------------------------------------------===//
// Captures
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{'fa.score_mod' op capture 'slope' must be a !fa.buffer, got 'f32'}}
fa.score_mod @scalar_capture(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%slope: f32) -> f32 {
  %r = arith.mulf %score, %slope : f32
  fa.yield %r : f32
}

// -----

// Custom syntax cannot spell a duplicate capture (the SSA name is taken); the generic
// form can, through capture_names.
// expected-error @+1 {{'fa.mask_mod' op captures 'ids' twice}}
"fa.mask_mod"() <{capture_names = ["ids", "ids"], result_type = i1, sym_name = "dup"}> ({
^bb0(%b: i32, %h: i32, %q: i32, %kv: i32, %x: !fa.buffer<i32, 1>, %y: !fa.buffer<i32, 1>):
  %c = arith.cmpi sge, %q, %kv : i32
  "fa.yield"(%c) : (i1) -> ()
}) : () -> ()

// -----

fa.mask_mod @dup_custom(%b: i32, %h: i32, %q: i32, %kv: i32)
    // expected-error @+2 {{region entry argument '%ids' is already in use}}
    // expected-note @+1 {{previously referenced here}}
    captures(%ids: !fa.buffer<i32, 1>, %ids: !fa.buffer<i32, 1>) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// -----

// A capture is bound by its SSA name, so a numbered value cannot be a capture.
fa.mask_mod @numeric_capture(%b: i32, %h: i32, %q: i32, %kv: i32)
    // expected-error @+1 {{capture '%0' needs an identifier as its name}}
    captures(%0: !fa.buffer<i32, 1>) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// -----

fa.mask_mod @dotted_capture(%b: i32, %h: i32, %q: i32, %kv: i32)
    // expected-error @+1 {{capture '%doc.ids' needs an identifier as its name}}
    captures(%doc.ids: !fa.buffer<i32, 1>) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// -----

// expected-error @+1 {{'fa.mask_mod' op capture name '0ids' must be an identifier}}
"fa.mask_mod"() <{capture_names = ["0ids"], result_type = i1, sym_name = "bad_name"}> ({
^bb0(%b: i32, %h: i32, %q: i32, %kv: i32, %x: !fa.buffer<i32, 1>):
  %c = arith.cmpi sge, %q, %kv : i32
  "fa.yield"(%c) : (i1) -> ()
}) : () -> ()

// -----

// expected-error @+1 {{'fa.mask_mod' op has 1 captures but 2 capture names}}
"fa.mask_mod"() <{capture_names = ["a", "b2"], result_type = i1, sym_name = "count"}> ({
^bb0(%b: i32, %h: i32, %q: i32, %kv: i32, %x: !fa.buffer<i32, 1>):
  %c = arith.cmpi sge, %q, %kv : i32
  "fa.yield"(%c) : (i1) -> ()
}) : () -> ()

//===----------------------------------------------------------------------===//
// fa.yield
//===----------------------------------------------------------------------===//

// -----

fa.score_mod @yield_i1(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c = arith.cmpi sge, %q, %kv : i32
  // expected-error @+1 {{'fa.yield' op yields 'i1' but 'fa.score_mod' returns 'f32'}}
  fa.yield %c : i1
}

// -----

fa.mask_mod @yield_i32(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'fa.yield' op yields 'i32' but 'fa.mask_mod' returns 'i1'}}
  fa.yield %q : i32
}

// -----

%t = arith.constant true
// expected-error @+1 {{'fa.yield' op expects parent op to be one of 'fa.score_mod, fa.mask_mod, fa.score_grad'}}
fa.yield %t : i1

//===----------------------------------------------------------------------===//
// Body ops
//===----------------------------------------------------------------------===//

// -----

fa.score_mod @atan(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'math.atan' op is not supported in a fa.score_mod body (allowed: pure arith and math ops on i1/i32/f32, fa.load, fa.scalar, fa.yield)}}
  %a = math.atan %score : f32
  fa.yield %a : f32
}

// -----

fa.mask_mod @addui_extended(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'arith.addui_extended' op is not supported in a fa.mask_mod body}}
  %s, %o = arith.addui_extended %q, %kv : i32, i1
  fa.yield %o : i1
}

// -----

fa.mask_mod @bitcast(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'arith.bitcast' op is not supported in a fa.mask_mod body}}
  %f = arith.bitcast %q : i32 to f32
  %c = arith.cmpf olt, %f, %f : f32
  fa.yield %c : i1
}

// -----

// Ops with regions are not supported (the only region ops registered are builtin.module
// and the mods themselves).
fa.mask_mod @module_in_body(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'builtin.module' op is not supported in a fa.mask_mod body}}
  builtin.module {}
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// -----

// A mod inside a mod is rejected by the Symbol trait before the body check.
fa.mask_mod @nested(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'fa.mask_mod' op symbol's parent must have the SymbolTable trait}}
  fa.mask_mod @inner(%b2: i32, %h2: i32, %q2: i32, %kv2: i32) -> i1 {
    %c = arith.cmpi sge, %q2, %kv2 : i32
    fa.yield %c : i1
  }
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}

// -----

fa.mask_mod @i64_result(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'arith.extsi' op produces unsupported type 'i64'; fa.mask_mod bodies compute on i1, i32 and f32}}
  %w = arith.extsi %q : i32 to i64
  %t = arith.trunci %w : i64 to i32
  %c = arith.cmpi sge, %t, %kv : i32
  fa.yield %c : i1
}

// -----

fa.score_mod @f16_result(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'arith.constant' op produces unsupported type 'f16'; fa.score_mod bodies compute on i1, i32 and f32}}
  %h16 = arith.constant 1.0 : f16
  fa.yield %score : f32
}

// -----

// An i64 operand can only come from an op that produces it, which is rejected first
// (previous case) unless the use comes before the definition in the block, as here:
// the body verifier walks the ops in order and the dominance check runs after it.
fa.mask_mod @i64_operand(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-error @+1 {{'arith.trunci' op uses unsupported type 'i64'; fa.mask_mod bodies compute on i1, i32 and f32}}
  %t = arith.trunci %w : i64 to i32
  %w = arith.extsi %q : i32 to i64
  %c = arith.cmpi sge, %t, %kv : i32
  fa.yield %c : i1
}

//===----------------------------------------------------------------------===//
// !fa.buffer
//===----------------------------------------------------------------------===//

// -----

fa.score_mod @f16_buffer(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    // expected-error @+1 {{fa.buffer element type must be f32 or i32, got 'f16'}}
    captures(%t: !fa.buffer<f16, 1>) -> f32 {
  fa.yield %score : f32
}

// -----

fa.score_mod @i64_buffer(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    // expected-error @+1 {{fa.buffer element type must be f32 or i32, got 'i64'}}
    captures(%t: !fa.buffer<i64, 1>) -> f32 {
  fa.yield %score : f32
}

// -----

fa.score_mod @rank0(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    // expected-error @+1 {{fa.buffer rank must be between 1 and 4, got 0}}
    captures(%t: !fa.buffer<f32, 0>) -> f32 {
  fa.yield %score : f32
}

// -----

fa.score_mod @rank5(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    // expected-error @+1 {{fa.buffer rank must be between 1 and 4, got 5}}
    captures(%t: !fa.buffer<i32, 5>) -> f32 {
  fa.yield %score : f32
}

//===----------------------------------------------------------------------===//
// fa.load
//===----------------------------------------------------------------------===//

// -----

fa.score_mod @load_rank1(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%t: !fa.buffer<f32, 1>) -> f32 {
  // expected-error @+1 {{'fa.load' op expects 1 index for a rank-1 buffer, got 2}}
  %x = fa.load %t[%q, %kv] : !fa.buffer<f32, 1>
  fa.yield %x : f32
}

// -----

fa.score_mod @load_rank3(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%t: !fa.buffer<f32, 3>) -> f32 {
  // expected-error @+1 {{'fa.load' op expects 3 indices for a rank-3 buffer, got 1}}
  %x = fa.load %t[%q] : !fa.buffer<f32, 3>
  fa.yield %x : f32
}

// -----

fa.score_mod @load_no_index(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%t: !fa.buffer<f32, 2>) -> f32 {
  // expected-error @+1 {{'fa.load' op expects 2 indices for a rank-2 buffer, got 0}}
  %x = fa.load %t[] : !fa.buffer<f32, 2>
  fa.yield %x : f32
}

// -----

fa.score_mod @load_result_type(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%t: !fa.buffer<i32, 1>) -> f32 {
  // expected-error @+1 {{'fa.load' op failed to verify that result type is the buffer's element type}}
  %x = "fa.load"(%t, %q) : (!fa.buffer<i32, 1>, i32) -> f32
  fa.yield %x : f32
}

// -----

// The parent check comes before the operand type checks, so any operand reaches it.
%c0 = arith.constant 0 : i32
// expected-error @+1 {{'fa.load' op expects parent op to be one of 'fa.score_mod, fa.mask_mod, fa.score_grad'}}
%x = "fa.load"(%c0) : (i32) -> f32

//===----------------------------------------------------------------------===//
// fa.scalar
//===----------------------------------------------------------------------===//

// -----

fa.score_mod @scalar_name(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'fa.scalar' op name '1cap' must be an identifier}}
  %c = fa.scalar "1cap" : f32
  fa.yield %c : f32
}

// -----

fa.score_mod @scalar_empty_name(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'fa.scalar' op name '' must be an identifier}}
  %c = fa.scalar "" : f32
  fa.yield %c : f32
}

// -----

fa.score_mod @scalar_f16(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'fa.scalar' op result #0 must be 32-bit float or 32-bit signless integer, but got 'f16'}}
  %c = fa.scalar "cap" : f16
  fa.yield %score : f32
}

// -----

// expected-error @+1 {{'fa.scalar' op expects parent op to be one of 'fa.score_mod, fa.mask_mod, fa.score_grad'}}
%w = fa.scalar "window" : i32

//===----------------------------------------------------------------------===//
// Module-level checks of --fa-annotate-deps (valid to the op verifiers)
//===----------------------------------------------------------------------===//

// -----

fa.mask_mod @window_i32(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  // expected-note @+1 {{first used here}}
  %w = fa.scalar "window" : i32
  %c = arith.cmpi slt, %q, %w : i32
  fa.yield %c : i1
}
fa.score_mod @window_f32(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'fa.scalar' op scalar 'window' is used as 'f32' here but as 'i32' elsewhere}}
  %w = fa.scalar "window" : f32
  %r = arith.addf %score, %w : f32
  fa.yield %r : f32
}

// -----

// Within one mod too.
fa.score_mod @one_mod(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-note @+1 {{first used here}}
  %a = fa.scalar "cap" : f32
  // expected-error @+1 {{'fa.scalar' op scalar 'cap' is used as 'i32' here but as 'f32' elsewhere}}
  %i = fa.scalar "cap" : i32
  fa.yield %a : f32
}

// -----

// The buffer is seen first (its mod comes first), then the scalar.
fa.score_mod @buf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%bias: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %bias[%h] : !fa.buffer<f32, 1>
  fa.yield %x : f32
}
fa.score_mod @scal(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'fa.scalar' op 'bias' names both a scalar and a captured buffer}}
  %s = fa.scalar "bias" : f32
  fa.yield %s : f32
}

// -----

// The scalar is seen first, then the capture (same mod: the body is visited first).
// expected-error @+1 {{'fa.score_mod' op 'bias' names both a scalar and a captured buffer}}
fa.score_mod @both(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%bias: !fa.buffer<f32, 1>) -> f32 {
  %s = fa.scalar "bias" : f32
  fa.yield %s : f32
}

// -----

fa.mask_mod @ids_i32(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%ids: !fa.buffer<i32, 1>) -> i1 {
  %x = fa.load %ids[%q] : !fa.buffer<i32, 1>
  %y = fa.load %ids[%kv] : !fa.buffer<i32, 1>
  %c = arith.cmpi eq, %x, %y : i32
  fa.yield %c : i1
}
// expected-error @+1 {{'fa.mask_mod' op captures 'ids' as '!fa.buffer<i32, 2>' but another mod captures it as '!fa.buffer<i32, 1>'}}
fa.mask_mod @ids_rank2(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%ids: !fa.buffer<i32, 2>) -> i1 {
  %x = fa.load %ids[%b, %q] : !fa.buffer<i32, 2>
  %y = fa.load %ids[%b, %kv] : !fa.buffer<i32, 2>
  %c = arith.cmpi eq, %x, %y : i32
  fa.yield %c : i1
}

// -----

fa.score_mod @t_f32(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%t: !fa.buffer<f32, 1>) -> f32 {
  fa.yield %score : f32
}
// expected-error @+1 {{captures 't' as '!fa.buffer<i32, 1>' but another mod captures it as '!fa.buffer<f32, 1>'}}
fa.score_mod @t_i32(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%t: !fa.buffer<i32, 1>) -> f32 {
  fa.yield %score : f32
}

// -----

// Two mods of one name in one module: the module's symbol table rejects it while parsing.
// expected-note @+1 {{see existing symbol definition here}}
fa.mask_mod @twice(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = arith.cmpi sge, %q, %kv : i32
  fa.yield %c : i1
}
// expected-error @+1 {{redefinition of symbol named 'twice'}}
fa.mask_mod @twice(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c = arith.cmpi sgt, %q, %kv : i32
  fa.yield %c : i1
}

// -----

// Across nested modules the symbol tables differ, but the mods of one compilation share
// one namespace: the pass rejects the second definition.
module {
  fa.mask_mod @twice(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
    %c = arith.cmpi sge, %q, %kv : i32
    fa.yield %c : i1
  }
}
module {
  // expected-error @+1 {{'fa.mask_mod' op redefines symbol @twice}}
  fa.mask_mod @twice(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
    %c = arith.cmpi sgt, %q, %kv : i32
    fa.yield %c : i1
  }
}

// -----

// A capture may not take a fixed argument's name: the printer names block arguments by
// position, so such a capture would not survive a round trip.
// expected-error @+1 {{capture name 'b' is reserved (score, b, h, q and kv name the fixed arguments)}}
fa.score_mod @shadow_b(%s: f32, %bb: i32, %hh: i32, %qq: i32, %kk: i32)
    captures(%b: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %b[%hh] : !fa.buffer<f32, 1>
  fa.yield %x : f32
}

// -----

fa.mask_mod @float_to_bool(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %f = fa.scalar "x" : f32
  // expected-error @+1 {{'arith.fptosi' op converts a float to i1; compare the float instead}}
  %r = arith.fptosi %f : f32 to i1
  fa.yield %r : i1
}

//===----------------------------------------------------------------------===//
// fa.score_grad / fa.grad_add (what fa-differentiate builds)
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{'fa.score_grad' op argument #5 ('dt') must be 'f32', got 'i32'}}
fa.score_grad @bad_dt(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32, %dt: i32) -> f32 {
  fa.yield %score : f32
}

// -----

// expected-error @+1 {{'fa.score_grad' op capture name 'dt' is reserved (it names a fixed argument)}}
fa.score_grad @dt_capture(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32, %dt0: f32)
    captures(%dt: !fa.buffer<f32, 1>) -> f32 {
  fa.yield %score : f32
}

// -----

fa.score_grad @int_grad(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32, %dt: f32)
    captures(%doc: !fa.buffer<i32, 1>) -> f32 {
  // expected-error @+1 {{'fa.grad_add' op needs an f32 buffer: '!fa.buffer<i32, 1>' has no gradient}}
  fa.grad_add %doc[%q], %dt : !fa.buffer<i32, 1>
  fa.yield %dt : f32
}

// -----

fa.score_grad @grad_rank(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32, %dt: f32)
    captures(%bias: !fa.buffer<f32, 2>) -> f32 {
  // expected-error @+1 {{'fa.grad_add' op expects 2 indices for a rank-2 buffer, got 1}}
  fa.grad_add %bias[%q], %dt : !fa.buffer<f32, 2>
  fa.yield %dt : f32
}

// -----

fa.score_mod @grad_add_in_mod(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%bias: !fa.buffer<f32, 1>) -> f32 {
  // expected-error @+1 {{'fa.grad_add' op expects parent op 'fa.score_grad'}}
  fa.grad_add %bias[%q], %score : !fa.buffer<f32, 1>
  fa.yield %score : f32
}
