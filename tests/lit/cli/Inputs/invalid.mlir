fa.mask_mod @bad(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %r = arith.addi %q, %kv : i32
  fa.yield %r : i32
}
