"""Tracing Python mods (no torch, no GPU): the IR of attention-gym style mods equals the C++
frontend's for the library mods, Python semantics of //, % and friends hold (checked by the
library's own evaluation of block masks on the CPU), and untraceable code fails naming the
construct and the line."""
import ctypes as C
import re

import pytest

import fajit
from fajit import _capi
from _host_buffer import host_buffer

# ---- IR comparison ---------------------------------------------------------------------------


def structure(ir):
    """Each mod's header and its result as one expression tree: equal for two IRs that compute
    the same values op by op, whatever order independent ops were recorded in (the C++ frontend
    records operands in C++'s evaluation order, Python left to right)."""
    out = []
    env = {}
    for line in ir.splitlines():
        line = line.strip()
        if line.startswith("fa.score_mod") or line.startswith("fa.mask_mod"):
            env = {}
            out.append(line)
            continue
        m = re.match(r"(%[\w]+) = (.*)$", line)
        if m:
            env[m.group(1)] = "(" + re.sub(r"%[\w]+", lambda t: env.get(t.group(0), t.group(0)), m.group(2)) + ")"
        elif line.startswith("fa.yield"):
            out.append(re.sub(r"%[\w]+", lambda t: env.get(t.group(0), t.group(0)), line))
    return "\n".join(out)


def same_ir(python_ir, cpp_ir):
    assert structure(python_ir) == structure(cpp_ir), f"python:\n{python_ir}\nC++:\n{cpp_ir}"


# attention-gym style mods, written as plain Python; their names are the C++ library's.
window = fajit.scalar("window", "int")
prefix = fajit.scalar("prefix", "int")
dilation = fajit.scalar("dilation", "int")
n_pad = fajit.scalar("n_pad", "int")
num_heads = fajit.scalar("num_heads", "int")
softcap_value = fajit.scalar("softcap", "float")
rel_offset = fajit.scalar("rel_offset", "int")
doc_ids = fajit.buffer("doc_ids", 1, "int")
rel_bias = fajit.buffer("rel_bias", 1, "float")


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < prefix) | (q_idx >= kv_idx)


def document(b, h, q_idx, kv_idx):
    return doc_ids[q_idx] == doc_ids[kv_idx]


def dilated_sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= window) & ((q_idx - kv_idx) % dilation == 0)


def padding(b, h, q_idx, kv_idx):
    return (q_idx >= n_pad) & (kv_idx >= n_pad)


def alibi(score, b, h, q_idx, kv_idx):
    return score + fajit.exp2(-8.0 * (h + 1) / num_heads) * (kv_idx - q_idx)


def softcap(score, b, h, q_idx, kv_idx):
    return softcap_value * fajit.tanh(score / softcap_value)


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + rel_bias[q_idx - kv_idx + rel_offset]


@pytest.mark.parametrize("mod,preset", [
    (causal, "causal"), (sliding_window, "sliding:64"), (prefix_lm, "prefix_lm:64"), (document, "document"),
    (dilated_sliding_window, "dilated:64:2"), (padding, "padding:3")])
def test_mask_mods_trace_to_the_cpp_library_ir(mod, preset):
    same_ir(fajit.mlir(mask_mod=mod), fajit.preset_mlir(mask=preset))


@pytest.mark.parametrize("mod,preset", [(alibi, "alibi"), (softcap, "softcap:30"), (relative_bias, "relative_bias")])
def test_score_mods_trace_to_the_cpp_library_ir(mod, preset):
    same_ir(fajit.mlir(score_mod=mod), fajit.preset_mlir(score=preset))


def test_score_and_mask_together():
    same_ir(fajit.mlir(alibi, sliding_window), fajit.preset_mlir(mask="sliding:8", score="alibi"))


def test_structure_tells_different_ir_apart():
    def not_causal(b, h, q_idx, kv_idx):
        return q_idx > kv_idx
    assert structure(fajit.mlir(mask_mod=not_causal)) != structure(fajit.preset_mlir(mask="causal"))


def test_raw_trace_needs_no_library():
    text = fajit.mlir(mask_mod=causal, canonicalize=False)
    assert text == ("module {\n"
                    "  fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
                    "    %0 = arith.cmpi sge, %q, %kv : i32\n"
                    "    fa.yield %0 : i1\n"
                    "  }\n"
                    "}\n")


# Mods with no C++ library twin: their canonical IR, pinned.

def test_natten_2d():
    W, KW = 16, 7  # image width, kernel width (constants: a new value is a new kernel)

    def natten(b, h, q_idx, kv_idx):
        qx, qy = q_idx % W, q_idx // W
        kx, ky = kv_idx % W, kv_idx // W
        return ((qx - kx).abs() <= KW // 2) & ((qy - ky).abs() <= KW // 2)

    ir = fajit.mlir(mask_mod=natten)
    s = structure(ir)
    assert "fa.mask_mod @natten(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {" in s
    assert ir.count("arith.floordivsi") == 2 and ir.count("math.absi") == 2
    assert "arith.constant 3 : i32" in ir  # KW // 2 folded in Python


def test_alibi_from_a_captured_slopes_buffer_and_relative_bias_table():
    slopes = fajit.buffer("slopes", 1)
    table = fajit.buffer("table", 2)

    def alibi_bias(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx) + table[h, q_idx - kv_idx + 1024]

    ir = fajit.mlir(score_mod=alibi_bias)
    assert "captures(%slopes: !fa.buffer<f32, 1>, %table: !fa.buffer<f32, 2>) -> f32" in ir
    assert "fa.load %slopes[%h] : !fa.buffer<f32, 1>" in ir
    caps = fajit.Program(fajit.trace(alibi_bias).text).captures()
    assert [(c["name"], c["is_buffer"], c["rank"], c["has_gradient"]) for c in caps] == [
        ("slopes", True, 1, True), ("table", True, 2, True)]


def test_chained_indexing_is_one_load():
    table = fajit.buffer("table", 2)

    def chained(score, b, h, q_idx, kv_idx):
        return score + table[h][q_idx - kv_idx]

    def tupled(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx]

    assert fajit.mlir(chained).replace("@chained", "@f") == fajit.mlir(tupled).replace("@tupled", "@f")


def test_softcap_with_a_python_number_is_a_constant():
    def tanh_softcap(score, b, h, q_idx, kv_idx):
        return 20 * fajit.tanh(score / 20)

    ir = fajit.mlir(score_mod=tanh_softcap)
    assert "arith.constant 2.000000e+01 : f32" in ir and "fa.scalar" not in ir


def test_sigmoid_where_clamp_min_max_and_casts():
    def mix(score, b, h, q_idx, kv_idx):
        s = fajit.where(q_idx >= kv_idx, fajit.sigmoid(score), fajit.clamp(score, -1.0, 1.0))
        return s + fajit.maximum(q_idx, kv_idx).float() * 0.5 + (q_idx == kv_idx).int() + score.sqrt().log()

    ir = fajit.mlir(score_mod=mix)
    for op in ("arith.select", "math.exp", "arith.maximumf", "arith.minimumf", "arith.maxsi", "arith.sitofp",
               "arith.extui", "math.sqrt", "math.log"):
        assert op in ir, op


def test_torch_style_and_masks_start_from_new_ones():
    def and_masks(*masks):  # torch.nn.attention.flex_attention.and_masks, torch-free
        def and_mask(b, h, q_idx, kv_idx):
            result = b.new_ones((), dtype=bool)
            for m in masks:
                result = result & m(b, h, q_idx, kv_idx)
            return result
        return and_mask

    same_ir(fajit.mlir(mask_mod=and_masks(causal, lambda b, h, q, kv: q - kv <= window)),
            fajit.preset_mlir(mask="sliding:8").replace("@sliding_window", "@and_mask"))


def test_combined_masks_and_lambdas():
    def and_masks(*masks):
        def m(b, h, q_idx, kv_idx):
            r = masks[0](b, h, q_idx, kv_idx)
            for other in masks[1:]:
                r = r & other(b, h, q_idx, kv_idx)
            return r
        return m

    same_ir(fajit.mlir(mask_mod=and_masks(causal, lambda b, h, q, kv: q - kv <= window)),
            fajit.preset_mlir(mask="sliding:8").replace("@sliding_window", "@m"))


# ---- Python semantics, evaluated by the library (block masks over b x h, one block each) -------

def mask_truth(mod, B, H):
    """mask_mod(b, h, 0, 0) for every b < B, h < H, as fajit evaluates it: a 16 x 16 mask with one
    block per (b, h) that the mask decides whole (it reads only b and h)."""
    lib = _capi.lib()
    p = fajit.Program(fajit.trace(mask_mod=mod).text)
    h = C.c_void_p()
    o = fajit._options()
    _capi.check(lib.fajit_program_block_mask(p.handle, B, H, 16, 16, 16, 16, None, C.byref(o), None, C.byref(h)))
    try:
        info = _capi.BlockMaskInfo()
        _capi.check(lib.fajit_block_mask_get_info(h, C.byref(info)))
        assert (info.batch, info.heads) == (B, H)
        full = (C.c_int32 * (B * H))()
        _capi.check(lib.fajit_block_mask_table(h, 2, full, B * H, None))
        return [[bool(full[b * H + hh]) for hh in range(H)] for b in range(B)]
    finally:
        lib.fajit_block_mask_destroy(h)


@pytest.mark.parametrize("expr", [
    lambda b, h: (b - 8) // 3 == h - 5,
    lambda b, h: (b - 8) % 5 == h,
    lambda b, h: (b - 8) % -3 == h - 2,
    lambda b, h: (h - 4) // -3 == (b - 8) // 4,
    lambda b, h: ((b - 8) % 5 == 0) ^ (h > 3),
    lambda b, h: abs(b - 8) == h,
    lambda b, h: -(b - 8) > h,
    lambda b, h: ((b < h) == False) | (b == 3),  # noqa: E712
    lambda b, h: ((b + 1) * h - 7) // 2 >= h * h - b,
    lambda b, h: (b & 3) == (h | 1),
    lambda b, h: ((b << 1) >> 2) == h,
])
def test_integer_semantics_are_pythons(expr):
    def mod(b, h, q_idx, kv_idx):
        return expr(b, h)

    got = mask_truth(mod, 16, 8)
    want = [[bool(expr(b, h)) for h in range(8)] for b in range(16)]
    assert got == want


def test_invert_is_torchs_logical_not_on_booleans():
    def mod(b, h, q_idx, kv_idx):
        return ~(b < h) | (b == 3)

    assert mask_truth(mod, 8, 8) == [[(not b < h) or b == 3 for h in range(8)] for b in range(8)]


def test_where_min_max_clamp_semantics():
    def mod(b, h, q_idx, kv_idx):
        return fajit.where(b > h, fajit.minimum(b, 5), fajit.clamp(h - b, 0, 3)) == fajit.maximum(h - 2, 1)

    got = mask_truth(mod, 12, 6)
    want = [[(min(b, 5) if b > h else max(0, min(h - b, 3))) == max(h - 2, 1) for h in range(6)] for b in range(12)]
    assert got == want


# ---- errors: the construct and the line ------------------------------------------------------

def line_of(fn, text):
    import inspect
    src, start = inspect.getsourcelines(fn)
    for i, l in enumerate(src):
        if text in l:
            return start + i
    raise AssertionError(text)


def test_python_if_on_a_traced_value_names_the_construct_and_line():
    def branchy(b, h, q_idx, kv_idx):
        if q_idx >= kv_idx:
            return True
        return False

    with pytest.raises(fajit.TraceError) as e:
        fajit.mlir(mask_mod=branchy)
    line = line_of(branchy, "if q_idx")
    assert str(e.value) == (
        "cannot trace mask_mod 'branchy': Python control flow on a traced value (`if`, `while`, `and`, `or`, "
        "`not`, bool()) is data-dependent; use torch.where(cond, a, b) and the operators &, |, ~ instead "
        f"(at test_trace.py:{line}: if q_idx >= kv_idx:)")


def test_python_and_is_control_flow_too():
    def uses_and(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx and q_idx - kv_idx < 10

    with pytest.raises(fajit.TraceError, match=r"Python control flow .* \(at test_trace.py:\d+: return q_idx >= kv_idx and"):
        fajit.mlir(mask_mod=uses_and)


def test_int_and_python_list_indexing_are_refused():
    table = [1, 2, 3]

    def lookup(score, b, h, q_idx, kv_idx):
        return score + table[h]

    def to_int(score, b, h, q_idx, kv_idx):
        return score + int(h)

    with pytest.raises(fajit.TraceError, match=r"score_mod 'lookup': a traced value cannot index a Python sequence"):
        fajit.mlir(score_mod=lookup)
    with pytest.raises(fajit.TraceError, match=r"int\(\) of a traced value needs its data"):
        fajit.mlir(score_mod=to_int)


def test_wrong_arity_names_the_argument():
    with pytest.raises(TypeError) as e:
        fajit.mlir(score_mod=causal)
    assert str(e.value) == "score_mod must take 5 arguments (score, b, h, q_idx, kv_idx); causal takes 4"
    with pytest.raises(TypeError) as e:
        fajit.mlir(mask_mod=alibi)
    assert str(e.value) == "mask_mod must take 4 arguments (b, h, q_idx, kv_idx); alibi takes 5"
    with pytest.raises(TypeError, match="mask_mod must be a function of 4 arguments, got int"):
        fajit.mlir(mask_mod=3)


def test_bad_results_and_buffers():
    def int_mask(b, h, q_idx, kv_idx):
        return q_idx - kv_idx

    def two_d(b, h, q_idx, kv_idx):
        return rel_bias[q_idx, kv_idx] > 0

    def bool_score(score, b, h, q_idx, kv_idx):
        return score > 0

    with pytest.raises(fajit.TraceError, match=r"mask_mod 'int_mask': a mask_mod must return a boolean \(a comparison\), got an integer"):
        fajit.mlir(mask_mod=int_mask)
    with pytest.raises(fajit.TraceError, match=r"buffer 'rel_bias' has 1 dimension but is indexed with 2 indices"):
        fajit.mlir(mask_mod=two_d)
    table = fajit.buffer("table", 2)

    def half_indexed(score, b, h, q_idx, kv_idx):
        return score + table[h]

    with pytest.raises(fajit.TraceError, match=r"buffer 'table' has 2 dimensions but is indexed with 1 index"):
        fajit.mlir(half_indexed)
    with pytest.raises(fajit.TraceError, match=r"a score_mod must return a score \(a float\), got a boolean"):
        fajit.mlir(score_mod=bool_score)
    with pytest.raises(ValueError, match=r"buffer name 'q' is reserved"):
        fajit.buffer("q", 1)


def test_library_errors_come_back_as_fajit_errors():
    with pytest.raises(fajit.FajitError, match="invalid fa IR"):
        fajit.Program("fa.mask_mod @m(")


def test_float_constants_beyond_float32_round_to_infinity():
    def big(score, b, h, q_idx, kv_idx):
        return fajit.minimum(score, 1e40)

    assert "arith.constant 0x7F800000 : f32" in fajit.mlir(big, canonicalize=False)


def test_compile_a_traced_variant_without_a_gpu():
    slopes = fajit.buffer("slopes", 1)

    def alibi_slopes(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    k = fajit.compile(alibi_slopes, causal, dtype="f16", head_dim_qk=64, arch="sm_80")
    src = k.cuda_source()
    assert "score_mod" in src and "fa.load %slopes[%h]" in src
    assert k.origin() in ("compiled", "disk", "memory") and len(k.cache_key()) >= 32
    k96 = fajit.compile(alibi_slopes, causal, head_dim_qk=96, head_dim_v=80, arch="sm_80")
    assert "fa::FwdConfig<fa::bf16_t, 96, 80," in k96.cuda_source()
    with pytest.raises(fajit.FajitError, match="head_dim_qk must be a multiple of 8 from 32 to 256, got 100"):
        fajit.compile(alibi_slopes, causal, head_dim_qk=100, arch="sm_80")
    with pytest.raises(ValueError, match="dtype must be 'bf16' or 'f16', got 'f32'"):
        fajit.compile(alibi_slopes, causal, dtype="f32")


def test_warm_compiles_the_lazy_kernels_without_a_gpu():
    def softcap(score, b, h, q_idx, kv_idx):
        return 20.0 * fajit.tanh(score / 20.0)

    k = fajit.compile(softcap, causal, head_dim_qk=64, arch="sm_80")
    assert k.warm() == 3  # the forward and the block-mask builder (its classifier and table kernels)
    assert k.warm(backward=True, decode=True) == 5
    assert k.warm(backward=True, decode=True) == 5  # once: the same kernels again
    assert k.warm(decode=True, row_max=True) == 6  # forward, builder (2), decoder and their two row-max twins

    def stepped(score, b, h, q_idx, kv_idx):
        return score + score.floor()

    ks = fajit.compile(stepped, causal, head_dim_qk=64, arch="sm_80")
    with pytest.raises(fajit.FajitError, match="cannot differentiate score_mod"):
        ks.warm(backward=True)


def test_warm_compiles_the_autotune_candidates():
    def scaled(score, b, h, q_idx, kv_idx):
        return score * 0.90625

    k = fajit.compile(scaled, causal, head_dim_qk=64, arch="sm_80")
    # sm_80: mma.sync tiles of 128 and 64 rows, the default's BLOCK_N and 32, 2 and 3 stages (the
    # default among them): the forward and seven others
    assert k.warm(block_mask=False, candidates=True) == 8
    assert k.warm(block_mask=False, candidates=True) == 8  # once
    assert k.warm(block_mask=False) == 1


def test_backward_in_background_compiles_beside_the_forward():
    def halved(score, b, h, q_idx, kv_idx):
        return score * 0.53125

    prog = fajit.Program(fajit.trace(halved, causal).text)
    k = fajit.Kernel(prog, head_dim_qk=64, arch="sm_80", backward_in_background=True)
    assert k.warm(block_mask=False, backward=True) == 2  # waits for the background compile if running

    def stepped(score, b, h, q_idx, kv_idx):
        return score + score.floor()

    ks = fajit.Kernel(fajit.Program(fajit.trace(stepped, causal).text), head_dim_qk=64, arch="sm_80",
                      backward_in_background=True)  # nothing to compile: no error until the backward
    with pytest.raises(fajit.FajitError, match="cannot differentiate score_mod"):
        ks.warm(backward=True)


def test_evaluate_runs_the_ir_on_the_cpu_and_checks_its_arguments():
    """fajit.Program.evaluate (C fajit_program_evaluate): the mods as the kernels compute them,
    on the CPU; test_trace_fuzz.py compares it with torch on random mods."""
    import array

    ids = fajit.buffer("ids", 1, dtype="int")
    bias = fajit.buffer("bias", 2)
    w = fajit.scalar("w", dtype="float")

    def doc(b, h, q_idx, kv_idx):
        return (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)

    def score(s, b, h, q_idx, kv_idx):
        return s * w + bias[h, kv_idx]

    prog = fajit.Program(fajit.trace(score, doc).text)
    id_vals = array.array("i", [0, 0, 1])
    bias_vals = array.array("f", [0.5, -1.0, 2.0, 0.25, 4.0, -8.0])  # [2, 3] as a flat buffer
    bufs = {"ids": id_vals, "bias": memoryview(bias_vals).cast("B").cast("f", (2, 3))}
    got = prog.evaluate([0, 0, 0], [0, 1, 1], [1, 2, 2], [0, 1, 2], score=[1.0, 2.0, -1.0], buffers=bufs,
                        scalars={"w": 3})
    assert got == ([3.5, 10.0, -11.0], [True, False, True])
    only_mask = fajit.Program(fajit.trace(mask_mod=doc).text)
    assert only_mask.evaluate([0], [0], [0], [2], buffers={"ids": id_vals}) == (None, [False])
    with pytest.raises(ValueError, match="one length"):
        prog.evaluate([0], [0], [0, 1], [0])
    with pytest.raises(fajit.FajitError, match="'ids' index 5 is out of bounds"):
        only_mask.evaluate([0], [0], [5], [0], buffers={"ids": id_vals})
    with pytest.raises(fajit.FajitError, match="missing capture 'ids'"):
        only_mask.evaluate([0], [0], [0], [0])
    with pytest.raises(ValueError, match="'ids' must be float32 or int32"):
        only_mask.evaluate([0], [0], [0], [0], buffers={"ids": array.array("d", [0.0])})


# ---- torch's semantics the trace fuzzer (test_trace_fuzz.py) checked, one test per finding ----

def evaluate(mod, points, score=None, scalars=None):
    """mod (a score_mod with `score`, else a mask_mod) traced and evaluated by the library at
    points [(b, h, q, kv), ...], its captured tensors bound as fajit.torch binds them."""
    is_score = score is not None
    t = fajit.trace(score_mod=mod) if is_score else fajit.trace(mask_mod=mod)
    prog = fajit.Program(t.text)
    buffers, bound = {}, dict(scalars or {})
    for name, obj in t.objects.items():
        if hasattr(obj, "dim"):  # a captured torch tensor
            torch = __import__("torch")
            if obj.dim() == 0:
                bound.setdefault(name, obj.item())  # (a value given wins: a runtime scalar)
            else:
                buffers[name] = host_buffer(obj.to(torch.float32 if obj.is_floating_point() else torch.int32))
    cols = [[p[i] for p in points] for i in range(4)]
    got_score, got_mask = prog.evaluate(*cols, score=score, buffers=buffers, scalars=bound)
    return got_score if is_score else got_mask


def test_bool_arithmetic_is_torchs_logic():
    # torch: bool + bool is their or, bool * bool their and, minimum / maximum and / or (fajit
    # added them as 0/1 integers: (q > kv) + (h > 0) was 2, and ~ of it bitwise)
    def add(b, h, q_idx, kv_idx):
        return ((q_idx > kv_idx) + (h > 0)) == 1

    def mul_not(b, h, q_idx, kv_idx):
        return ~((q_idx > kv_idx) * (h > 0))

    def maxi(b, h, q_idx, kv_idx):
        return ~fajit.maximum(q_idx > kv_idx, h > 0)

    pts = [(0, h, q, 1) for h in (0, 1) for q in (0, 2)]
    assert evaluate(add, pts) == [False, True, True, True]
    assert evaluate(mul_not, pts) == [True, True, True, False]
    assert evaluate(maxi, pts) == [True, False, False, False]

    def scaled(score, b, h, q_idx, kv_idx):
        return score + ((q_idx > kv_idx) + (h > 0)) * 3  # True * 3

    assert evaluate(scaled, pts, score=[0.5] * 4) == [0.5, 3.5, 3.5, 3.5]
    for bad, what in ((lambda s, b, h, q, kv: s - (q > kv), "subtraction with a boolean"),
                      (lambda s, b, h, q, kv: s + -(q > kv), "negating a boolean"),
                      (lambda s, b, h, q, kv: s + abs(q > kv), "abs of a boolean")):
        with pytest.raises(fajit.TraceError, match=what):
            fajit.mlir(bad)


def test_shifts_beyond_the_width_are_torchs():
    # torch: << by an amount outside [0, 32) is 0, >> fills with the sign (arith's shifts are
    # poison there: the interpreter refused, the kernels' were undefined)
    def shifted(score, b, h, q_idx, kv_idx):
        s = kv_idx - 4  # -4 .. 4 at these points, and 40 below
        return ((q_idx - 3) << (s * 10)) + ((q_idx - 3) >> (s * 10)) * 1000 + ((q_idx - 3) << 40) * 7

    pts = [(0, 0, q, kv) for q in (0, 5) for kv in (0, 4, 5, 8)]
    want = []
    for q in (0, 5):
        for kv in (0, 4, 5, 8):
            s, x = (kv - 4) * 10, q - 3
            left = (x << s) if 0 <= s < 32 else 0
            left = (left + 2**31) % 2**32 - 2**31
            right = x >> min(s, 31) if s >= 0 else x >> 31
            want.append(float(left + right * 1000))
    assert evaluate(shifted, pts, score=[0.0] * len(pts)) == want


def test_half_and_bfloat16_casts_round_as_torch():
    # fajit took .half() / .bfloat16() / .to(torch.float16) as float32 (no rounding)
    torch = pytest.importorskip("torch")
    xs = [0.1, -3.904, 65504.0, 65519.0, 65520.0, -1e5, 1e-8, -1e-8, 3e-8, 2.0**-24 * 1.5, 2.0**-24 * 2.5,
          1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 3.3895e38, 3.4e38, 1e-39, -1e-41, float("inf"), float("nan")]
    xs = torch.tensor(xs, dtype=torch.float32).tolist()
    pts = [(0, 0, 0, 0)] * len(xs)
    for cast, dtype in (("half", torch.float16), ("bfloat16", torch.bfloat16)):
        def mod(score, b, h, q_idx, kv_idx):
            return getattr(score, cast)().float()

        got = torch.tensor(evaluate(mod, pts, score=xs))
        want = torch.tensor(xs).to(dtype).float()
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), (cast, got, want)
        assert torch.equal(torch.signbit(got[:-1]), torch.signbit(want[:-1])), cast  # -0.0 stays negative
    # a constant converted to float16 is folded: masked_fill's value into a float16 buffer's dtype
    hb = torch.zeros(2, dtype=torch.float16)
    folded = fajit.mlir(lambda s, b, h, q, kv: s + hb[q].masked_fill(q > kv, 0.1), canonicalize=False)
    assert f"arith.constant {fajit._trace._f32_literal(torch.tensor(0.1).half().item())} : f32" in folded
    assert "arith.select" in folded and "arith.mulf" not in folded


def test_uint8_int8_int16_captures_wrap_as_torchs():
    # a captured uint8 / int8 / int16 tensor was computed as int32: u8 - 1 gave -1 (torch 255),
    # i8 * 2 gave 254 (torch -2), u8 == -1 compared with -1 (torch converts -1 to 255)
    torch = pytest.importorskip("torch")
    u8 = torch.tensor([0, 200, 255], dtype=torch.uint8)
    i8 = torch.tensor([-128, -1, 127], dtype=torch.int8)
    i16 = torch.tensor([-32768, 30000, 5], dtype=torch.int16)
    pts = [(0, 0, q, 0) for q in range(3)]
    zero = [0.0] * 3
    cases = [
        (lambda s, b, h, q, kv: s + (u8[q] - 1), lambda q: u8[q] - 1),
        (lambda s, b, h, q, kv: s + (u8[q] + 300), lambda q: u8[q] + 300),
        (lambda s, b, h, q, kv: s + i8[q] * 2, lambda q: i8[q] * 2),
        (lambda s, b, h, q, kv: s + abs(i8[q]), lambda q: abs(i8[q])),
        (lambda s, b, h, q, kv: s + (-u8[q]), lambda q: -u8[q]),
        (lambda s, b, h, q, kv: s + ~u8[q], lambda q: ~u8[q]),
        (lambda s, b, h, q, kv: s + i16[q] * 3, lambda q: i16[q] * 3),
        (lambda s, b, h, q, kv: s + (u8[q] + i8[q]), lambda q: u8[q] + i8[q]),  # int16: no wrap
        (lambda s, b, h, q, kv: s + u8[q] // -2, lambda q: u8[q] // -2),
        (lambda s, b, h, q, kv: s + (u8[q] << 1), lambda q: u8[q] << 1),
        (lambda s, b, h, q, kv: s + ((q + 1) * 100).to(torch.int8), lambda q: (torch.tensor(q + 1) * 100).to(torch.int8)),
        (lambda s, b, h, q, kv: s + ((q + 1) * 100).byte(), lambda q: (torch.tensor(q + 1) * 100).byte()),
        (lambda s, b, h, q, kv: s + (u8[q] == -1) + (i8[q] > 200) * 10, lambda q: (u8[q] == -1) + (i8[q] > 200) * 10),
        (lambda s, b, h, q, kv: s + torch.where(q > 0, u8[q], -1), lambda q: torch.where(torch.tensor(q > 0), u8[q], -1)),
        (lambda s, b, h, q, kv: s + torch.clamp(i8[q], min=-1000, max=100), lambda q: min(i8[q], 100)),
    ]
    for mod, want in cases:
        assert evaluate(mod, pts, score=zero) == [float(want(q)) for q in range(3)], fajit.mlir(mod)
    scal = torch.tensor(200, dtype=torch.uint8)  # a runtime scalar of its dtype too
    assert evaluate(lambda s, b, h, q, kv: s + (scal + 100), pts[:1], score=[0.0]) == [44.0]
    with pytest.raises(fajit.TraceError, match=r"the value 300 cannot be converted to torch.uint8 without overflow"):
        fajit.mlir(lambda s, b, h, q, kv: s + torch.where(q > 0, u8[q], 300))
    with pytest.raises(fajit.TraceError, match=r"the value -2.5 cannot be converted to torch.uint8"):
        fajit.mlir(lambda s, b, h, q, kv: s + u8[q].masked_fill(q > 0, -2.5))
    # clamp by a Python int beyond the range: nothing clamped (torch 2.15; 2.11 wrapped -1 to 255)
    assert evaluate(lambda s, b, h, q, kv: s + u8[q].clamp_min(-1), pts, score=zero) == [0.0, 200.0, 255.0]
    with pytest.raises(fajit.TraceError, match=r"clamp: the max value -1 is outside the range of torch.uint8"):
        fajit.mlir(lambda s, b, h, q, kv: s + torch.clamp(u8[q], max=-1))


def test_bool_captures_are_booleans():
    # a captured bool tensor was refused as a buffer, and as a 0-d one became an int scalar (so
    # `flag & mask` was an int and `~flag` -1 / -2); fajit.scalar(name, "bool") gave invalid IR
    torch = pytest.importorskip("torch")
    allowed = torch.tensor([[True, False], [False, True]])
    flag = torch.tensor(True)
    pts = [(0, 0, q, kv) for q in (0, 1) for kv in (0, 1)]

    def table(b, h, q_idx, kv_idx):
        return allowed[q_idx, kv_idx] | (~flag & (q_idx > kv_idx))

    assert evaluate(table, pts) == [True, False, False, True]
    assert evaluate(table, pts, scalars={"flag": False}) == [True, False, True, True]
    declared = fajit.scalar("on", "bool")
    assert evaluate(lambda b, h, q, kv: declared & (q >= kv), pts, scalars={"on": True}) == [True, False, True, True]


def test_masked_fill_keeps_the_dtype_and_indices_are_ints():
    torch = pytest.importorskip("torch")
    # torch's masked_fill converts the value to the tensor's dtype (an int one filled with 2.7
    # holds 2); fajit promoted it as torch.where does (2.7)
    pts = [(0, 0, 0, kv) for kv in (0, 1)]
    assert evaluate(lambda s, b, h, q, kv: s + kv.masked_fill(kv > 0, 2.7) * 1.0, pts, score=[0.0, 0.0]) == [0.0, 2.0]
    # torch indexes with int32 / int64 only: a bool or uint8 index is a mask, int8 an error
    ids = torch.tensor([3, 1, 2], dtype=torch.uint8)
    bias = torch.zeros(4)
    with pytest.raises(fajit.TraceError, match="indexed with a uint8 value"):
        fajit.mlir(lambda s, b, h, q, kv: s + bias[ids[q]])
    with pytest.raises(fajit.TraceError, match="indexed with a bool value"):
        fajit.mlir(lambda s, b, h, q, kv: s + bias[q > kv])
    assert "fa.load" in fajit.mlir(lambda s, b, h, q, kv: s + bias[ids[q].int()])
    # tensor methods that are torch functions trace as those (x.neg() was refused)
    assert evaluate(lambda s, b, h, q, kv: s + kv.neg().remainder(3), pts, score=[0.0, 0.0]) == [0.0, 2.0]
    with pytest.raises(fajit.TraceError, match="rounding_mode must be None, 'trunc' or 'floor'"):
        fajit.mlir(lambda s, b, h, q, kv: s + torch.div(q, 2, rounding_mode="round"))


def test_integer_division_by_minus_one_is_torchs():
    # INT_MIN // -1 and INT_MIN % -1 are undefined in arith (the interpreter raised): torch wraps
    # them to INT_MIN and 0; a constant -1 divisor is a negation / a zero
    def mod(b, h, q_idx, kv_idx):
        m = (q_idx + 1) << 31  # INT_MIN at q = 0, 0 at q = 1
        return ((m // -1) == m) & ((m % -1) == 0) & (fajit.where(h > 0, m, q_idx) // -1 == -fajit.where(h > 0, m, q_idx))

    assert evaluate(mod, [(0, h, q, 0) for h in (0, 1) for q in (0, 1)]) == [True] * 4
    assert "divsi" not in fajit.mlir(mask_mod=mod) and "rem" not in fajit.mlir(mask_mod=mod)


def test_review_fixes_where_method_rsub_alpha_int_fill_and_node_order():
    """A captured 0-d tensor's .where(cond, other) is torch's (self where cond, else other);
    torch.rsub's alpha scales the input; an integer filled with -inf is torch's error (not an
    undefined float-to-int conversion); a scalar times an index keeps fa.scalar ahead of the
    conversions (the IR, and so the kernel's cache key, of such mods is unchanged)."""
    torch = pytest.importorskip("torch")
    cap = torch.tensor(5.0)

    def where_method(s, b, h, q_idx, kv_idx):
        return s + cap.where(q_idx > kv_idx, -1.0)

    p = fajit.Program(fajit.trace(where_method).text)
    name = p.captures()[0]["name"]
    assert p.evaluate([0, 0], [0, 0], [1, 0], [0, 1], score=[0.0, 0.0], scalars={name: 5.0})[0] == [5.0, -1.0]

    def rsub(s, b, h, q_idx, kv_idx):
        return torch.rsub(s, 1.0, alpha=2)

    assert fajit.Program(fajit.trace(rsub).text).evaluate([0], [0], [0], [0], score=[0.5])[0] == [0.0]

    def int_fill(s, b, h, q_idx, kv_idx):
        return s + (q_idx - kv_idx).masked_fill(q_idx < kv_idx, float("-inf"))

    with pytest.raises(fajit.TraceError, match=r"-inf cannot be converted to torch.int32"):
        fajit.trace(int_fill)
    slope = fajit.scalar("slope", "float")
    text = fajit.mlir(score_mod=lambda s, b, h, q_idx, kv_idx: s + (kv_idx - q_idx) * slope)
    assert text.index('fa.scalar "slope"') < text.index("arith.sitofp"), text
