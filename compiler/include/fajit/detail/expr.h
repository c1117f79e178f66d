// The one-line expression language of `fajit dump --mask-mod EXPR --score-mod EXPR`: a
// mask_mod or score_mod written as a C-like expression instead of C++.
//
//   fa::MaskMod  m = fa::parse_mask_mod("q >= kv && q - kv <= window");
//   fa::ScoreMod s = fa::parse_score_mod("softcap * tanh(score / softcap)");
//   fa::Program p = fa::trace(s, m);            // same IR as the C++ mods would give
//
// The text is parsed (and type-checked) once, when parse_*_mod is called: every error in it
// throws fa::Error there. The returned mod holds the parsed tree and replays it over symbolic
// values each time it is traced, so it may be traced any number of times.
//
// ---- the language -----------------------------------------------------------------------
// Values are integers (i32), floats (f32) and booleans (i1).
//
//  names      b h q kv           the integer coordinates (batch, head, query, key)
//             score              the float score (score_mod only)
//             true false         boolean literals
//             inf                +infinity as a float (write -inf for minus infinity)
//  literals   7  0  2147483647   integers (decimal, i32 range; -2147483648 is accepted)
//             1.5  2.  .5  1e-3  2.f  1.5F
//                                floats: a '.' or an exponent makes a float; an optional
//                                f/F suffix is allowed on floats only
//  operators  (C precedence, highest first; binary ones associate left to right)
//             -x  !x             negation (numbers), logical not (booleans)
//             *  /  %            '/' on integers truncates toward zero, '%' takes the sign of
//                                the dividend; '%' needs integers
//             +  -
//             <  <=  >  >=       numbers only; give a boolean
//             ==  !=             two numbers or two booleans; give a boolean
//             &&                 booleans only (both sides are always evaluated)
//             ||                 booleans only
//             c ? a : b          c boolean; a and b both numbers or both booleans
//                                (right associative, like C)
//             ( ... )
//  promotion  an integer operand meeting a float (in arithmetic, comparisons, min/max/pow,
//             ?: branches) is converted to float, as fa::Index promotes to fa::Score; a
//             float-only function (exp, tanh, ...) converts an integer argument to float.
//             Booleans never convert implicitly: use int(c) or float(c).
//  functions  min(a,b) max(a,b) abs(x)           integer if every argument is, else float
//             exp exp2 log log2 tanh sqrt rsqrt sigmoid sin cos floor ceil erf   (1 arg)
//             pow(x,y)                           float
//             where(c,a,b)                       same as c ? a : b
//             float(x)                           integer/boolean/float -> float
//             int(x)                             float (truncates) / boolean / integer -> int
//  captures   any other name is a capture bound at launch:
//             name[i] / name[i, j, ...]   an element of a captured buffer of that rank (1..4);
//                                         indices must be integers
//             name                        a runtime scalar (never recompiles when changed)
//             Their type is i32 in a mask_mod expression and f32 in a score_mod expression
//             unless ExprCaptureTypes says otherwise (e.g. from `--capture bias:f32`). A name
//             is either a buffer of one rank or a scalar within one expression.
//  result     a mask_mod expression must be a boolean; a score_mod expression must be a
//             number (an integer result is converted to float).
//
// Examples
//   mask:  q >= kv                                  causal
//          kv < prefix || q >= kv                   prefix LM
//          doc_ids[q] == doc_ids[kv] && q >= kv     causal document packing
//          q >= kv && q - kv <= window && (q - kv) % dilation == 0
//   score: score + slopes[h] * (kv - q)             ALiBi with a slopes buffer (f32)
//          softcap * tanh(score / softcap)          soft capping
//          score + bias[h, q - kv + offset]         needs ExprCaptureTypes{{"offset", false}}
//          q >= kv ? score : -inf
//
// Errors name the column (1-based, in bytes) and echo the expression with a caret:
//   mask-mod expression: unexpected ')' at column 9
//     q >= kv )
//             ^
// Nesting (parentheses, unary operators, calls, ?:) is limited to 256 levels and the parsed
// tree to 1024 levels, so no input can exhaust the stack.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "fajit/frontend.h"

namespace fa {

// Per-capture type overrides: name -> is_float (true: f32, false: i32). Names the expression
// does not use are ignored, so one map can serve both the mask and the score expression.
struct ExprCaptureTypes {
  std::map<std::string, bool> types;
};

// Parses a score_mod expression; the mod is named "score_expr". Throws fa::Error.
ScoreMod parse_score_mod(std::string_view expr, const ExprCaptureTypes& types = {});
// Parses a mask_mod expression; the mod is named "mask_expr". Throws fa::Error.
MaskMod parse_mask_mod(std::string_view expr, const ExprCaptureTypes& types = {});

}  // namespace fa
