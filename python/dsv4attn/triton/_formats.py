"""Number formats in Triton, by bit manipulation: fp8 e4m3fn, bf16, UE8M0 scales.

The rules are include/dsv4/dtype.h's, written with integer operations only, so every backend
Triton targets (NVIDIA of any generation, AMD, Intel, and the CPU interpreter) encodes exactly
the bytes the CPU reference writes, without native fp8 support (sm_80 and MI300 lack OCP e4m3fn
conversions) and independent of how a backend rounds `.to(tl.bfloat16)` (the interpreter
truncates).

    fp8 e4m3fn : 1-4-3, bias 7, round-to-nearest-even, |x| >= 448 and inf saturate to +-448,
                 NaN -> 0x7F | sign.
    bf16       : round-to-nearest-even, NaN kept quiet.
    UE8M0      : the power-of-two scale 2^ceil(log2(max(amax / 448, 1e-4))), byte = exponent + 127.

Codes travel as int32 tensors holding 0..255 (loads of uint8 widen to int32 before use); bf16
values inside caches travel as int16 bit patterns (exact in the interpreter too, whose bf16
conversions mishandle subnormals).
"""
import triton
import triton.language as tl

FP8_MAX = 448.0


@triton.jit
def fp8_e4m3_to_f32(code):
    """Decodes e4m3fn byte codes (any integer tensor holding 0..255) to fp32, exactly."""
    c = code.to(tl.uint32) & 0xFF
    sign = (c & 0x80) << 24
    e = (c >> 3) & 0xF
    m = c & 0x7
    normal = (sign | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    # The sign goes in as a bit: a negation may lower to 0 - x, which turns code 0x80 into +0.
    sub = ((m.to(tl.float32) * (1.0 / 512.0)).to(tl.uint32, bitcast=True) | sign).to(
        tl.float32, bitcast=True)
    v = tl.where(e == 0, sub, normal)
    nan = (sign | 0x7FC00000).to(tl.float32, bitcast=True)  # NaN keeps its sign
    return tl.where((e == 15) & (m == 7), nan, v)


@triton.jit
def f32_to_fp8_e4m3(x):
    """Encodes fp32 values as e4m3fn byte codes (int32 0..255), dtype.h float_to_fp8_e4m3."""
    u = x.to(tl.uint32, bitcast=True)
    sign = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    e = (a >> 23).to(tl.int32) - 127
    tiny = e < -6
    # fp8 subnormals (and zero): quantum 2^-9, round half to even on the integer part.
    v = tl.where(tiny, a.to(tl.float32, bitcast=True) * 512.0, 0.0)
    q = v.to(tl.uint32)
    frac = v - q.to(tl.float32)
    q = q + ((frac > 0.5) | ((frac == 0.5) & ((q & 1) == 1))).to(tl.uint32)
    # Normal range: keep 3 mantissa bits, round half to even (a carry may bump the exponent).
    mant = a & 0x7FFFFF
    code = ((tl.maximum(e, -6) + 7).to(tl.uint32) << 3) | (mant >> 20)
    rest = mant & 0xFFFFF
    code = code + ((rest > 0x80000) | ((rest == 0x80000) & ((code & 1) == 1))).to(tl.uint32)
    code = tl.minimum(code, 0x7E)
    r = tl.where(tiny, q, code)
    r = tl.where(a >= 0x43E00000, 0x7E, r)  # >= 448 and inf saturate
    r = tl.where(a > 0x7F800000, 0x7F, r)  # NaN kept
    return (r | sign).to(tl.int32)


@triton.jit
def round_bf16(x):
    """x rounded to the nearest bf16 value (ties to even), still as fp32: storing it to a bf16
    tensor is then exact on every backend."""
    u = x.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    r = tl.where((u & 0x7FFFFFFF) > 0x7F800000, u | 0x00400000, r)
    return r.to(tl.float32, bitcast=True)


@triton.jit
def bf16_bits_to_f32(bits):
    """bf16 bit patterns (int16 tensor) as fp32, exactly (subnormals and NaN included)."""
    return ((bits.to(tl.uint32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)


@triton.jit
def f32_to_bf16_bits(x):
    """fp32 -> bf16 bit patterns (int16), round-to-nearest-even: dtype.h float_to_bf16_bits."""
    return (round_bf16(x).to(tl.uint32, bitcast=True) >> 16).to(tl.int16)


@triton.jit
def ue8m0_exponent(amax):
    """k with 2^k = 2^ceil(log2(max(amax / 448, 1e-4))), from the bits (int32). NaN -> floor."""
    x = tl.div_rn(amax, 448.0)
    x = tl.where(x >= 1e-4, x, 1e-4)
    u = x.to(tl.uint32, bitcast=True)
    e = (u >> 23).to(tl.int32) - 127
    return tl.where((u & 0x7FFFFF) != 0, e + 1, e)


@triton.jit
def exp2_int(k):
    """2^k as fp32 for integer k in [-126, 127]."""
    return ((k + 127).to(tl.uint32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def ue8m0_to_f32(byte):
    """A UE8M0 scale byte as fp32: 2^(byte - 127); 0 -> 2^-127, 0xFF -> NaN."""
    b = byte.to(tl.uint32) & 0xFF
    v = (b << 23).to(tl.float32, bitcast=True)
    v = tl.where(b == 0, 5.877471754111438e-39, v)
    return tl.where(b == 0xFF, float("nan"), v)


@triton.jit
def fp8_quantize(x, k):
    """(codes, dequantized values) of x in a block with scale exponent k (ue8m0_exponent)."""
    codes = f32_to_fp8_e4m3(x * exp2_int(-k))
    return codes, fp8_e4m3_to_f32(codes) * exp2_int(k)
