/* The C API through pkg-config: parse a mask_mod and print its canonical IR. */
#include <stdio.h>

#include <fajit/fajit_c.h>

int main(void) {
  fajit_program* p = NULL;
  if (fajit_program_parse("fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
                          "  %0 = arith.cmpi sge, %q, %kv : i32\n  fa.yield %0 : i1\n}\n",
                          &p) != FAJIT_OK) {
    fprintf(stderr, "%s\n", fajit_last_error());
    return 1;
  }
  puts(fajit_program_mlir(p));
  fajit_program_destroy(p);
  return 0;
}
