// Only a mask_mod: the score_mod defaults to the identity.
fa.mask_mod @band(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %d = arith.subi %q, %kv : i32
  %a = math.absi %d : i32
  %c8 = arith.constant 8 : i32
  %r = arith.cmpi slt, %a, %c8 : i32
  fa.yield %r : i1
}
