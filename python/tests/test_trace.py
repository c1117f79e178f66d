"""Tracing Python mods (no torch, no GPU): the IR of attention-gym style mods equals the C++
frontend's for the library mods, Python semantics of //, % and friends hold (checked by the
library's own evaluation of block masks on the CPU), and untraceable code fails naming the
construct and the line."""
import ctypes as C
import re

import pytest

import fajit
from fajit import _capi

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
    assert k.warm() == 2  # the forward and the block-mask builder
    assert k.warm(backward=True, decode=True) == 4
    assert k.warm(backward=True, decode=True) == 4  # once: the same kernels again
    assert k.warm(decode=True, row_max=True) == 5  # forward, builder, decoder and their two row-max twins

    def stepped(score, b, h, q_idx, kv_idx):
        return score + score.floor()

    ks = fajit.compile(stepped, causal, head_dim_qk=64, arch="sm_80")
    with pytest.raises(fajit.FajitError, match="cannot differentiate score_mod"):
        ks.warm(backward=True)


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
