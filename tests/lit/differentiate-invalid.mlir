// RUN: fajit-opt %s --split-input-file --verify-diagnostics --fa-differentiate
//
// One case per diagnostic of fa-differentiate: an op with no derivative on the way of the
// adjoint of the score (or of an f32 buffer element).

fa.score_mod @floor(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'math.floor' op has no derivative (a step function); the gradient of score_mod @floor would flow through it}}
  %f = math.floor %score : f32
  %r = arith.addf %score, %f : f32
  fa.yield %r : f32
}

// -----

// A float buffer's adjoint is refused the same way.
fa.score_mod @ceil_of_buffer(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%w: !fa.buffer<f32, 1>) -> f32 {
  %x = fa.load %w[%h] : !fa.buffer<f32, 1>
  // expected-error @+1 {{'math.ceil' op has no derivative (a step function); the gradient of score_mod @ceil_of_buffer would flow through it}}
  %c = math.ceil %x : f32
  %r = arith.addf %score, %c : f32
  fa.yield %r : f32
}

// -----

fa.score_mod @remf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %one = arith.constant 1.0 : f32
  // expected-error @+1 {{'arith.remf' op has no derivative (a sawtooth in both operands); the gradient of score_mod @remf would flow through it}}
  %r = arith.remf %score, %one : f32
  fa.yield %r : f32
}

// -----

// fptosi of the score: the integer carries no adjoint, but the result depends on it.
fa.score_mod @fptosi(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  // expected-error @+1 {{'arith.fptosi' op has no derivative (it rounds a value that depends on the score or a float buffer to an integer); the gradient of score_mod @fptosi would flow through it}}
  %i = arith.fptosi %score : f32 to i32
  %f = arith.sitofp %i : i32 to f32
  fa.yield %f : f32
}
