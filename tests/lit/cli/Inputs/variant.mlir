// A score_mod and a mask_mod as a user would write them by hand: ALiBi with a slopes buffer,
// causal document packing. Names in the source are free; the printer uses the fixed ones.
fa.score_mod @my_alibi(%s: f32, %bb: i32, %hh: i32, %qq: i32, %kk: i32)
    captures(%slopes: !fa.buffer<f32, 1>) -> f32 {
  %d = arith.subi %kk, %qq : i32
  %df = arith.sitofp %d : i32 to f32
  %sl = fa.load %slopes[%hh] : !fa.buffer<f32, 1>
  %m = arith.mulf %df, %sl : f32
  %r = arith.addf %s, %m : f32
  fa.yield %r : f32
}
fa.mask_mod @doc_causal(%b: i32, %h: i32, %q: i32, %kv: i32)
    captures(%doc: !fa.buffer<i32, 1>) -> i1 {
  %dq = fa.load %doc[%q] : !fa.buffer<i32, 1>
  %dk = fa.load %doc[%kv] : !fa.buffer<i32, 1>
  %same = arith.cmpi eq, %dq, %dk : i32
  %causal = arith.cmpi sge, %q, %kv : i32
  %dead = arith.addi %q, %kv : i32
  %keep = arith.andi %same, %causal : i1
  fa.yield %keep : i1
}
