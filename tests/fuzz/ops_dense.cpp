// Fuzzed dense ops (ops.h: projections, FP8 (de)quantization, norms, RoPE, the output path) and
// synthetic_hidden (synthetic.h).
#include "dsv4/ops.h"
#include "dsv4/synthetic.h"
#include "op_table.h"

namespace dsv4::fuzz {

namespace {

DType float_dtype(Rng& rng) { return draw_of(rng, {DType::bf16, DType::fp32}); }
DType scale_dtype(Rng& rng) { return draw_of(rng, {DType::fp32, DType::ue8m0}); }

// Scales [rows, cols] stored either row-major or as the transpose of a [cols, rows] buffer (the
// CUDA GEMMs' layout); both are accepted.
Arg scales(std::string name, DType t, int64_t rows, int64_t cols, Rng& rng) {
  Arg a = real(std::move(name), t, {rows, cols});
  if (coin(rng)) a.strides = {1, rows};
  return a;
}

// ---- linear: bf16/fp32 operands, or FP8 operands with block scales ------------------------------
Case make_linear(Rng& rng) {
  Case c;
  if (draw(rng, 0, 2) == 0) {
    // FP8: T a multiple of kFp8GemmRowMultiple, fp32 scales in cuBLASLt's layouts.
    const int64_t T = kFp8GemmRowMultiple * draw(rng, 1, 2), K = 128 * draw(rng, 1, 2),
                  N = draw_of<int64_t>(rng, {64, 128, 160});
    c.args.push_back(real("x", DType::fp8_e4m3, {T, K}));
    Arg xs = real("x_scale", DType::fp32, {T, K / 128});
    xs.strides = {1, T};
    c.args.push_back(xs);
    c.args.push_back(real("w", DType::fp8_e4m3, {N, K}));
    Arg ws = real("w_scale", DType::fp32, {(N + 127) / 128, K / 128});
    ws.strides = {fp8_weight_scale_row_stride(K), 1};
    c.args.push_back(ws);
    c.args.push_back(output("y", float_dtype(rng), {T, N}));
  } else {
    const DType t = float_dtype(rng);
    const int64_t T = draw(rng, 1, 5), K = draw_of<int64_t>(rng, {16, 64, 128}), N = draw_of<int64_t>(rng, {8, 32});
    c.args.push_back(real("x", t, {T, K}));
    c.args.push_back(real("w", t, {N, K}));
    c.args.push_back(output("y", t == DType::fp32 ? DType::fp32 : float_dtype(rng), {T, N}));
  }
  return c;
}
void call_linear(const Bound& b) {
  linear(b.t("x"), b.t("x_scale"), b.t("w"), b.t("w_scale"), b.t("y"));
}
Case make_linear_workspace(Rng& rng) {
  Case c = make_linear(rng);
  Arg ws = bytes("workspace", {int64_t{1} << 16}, Role::output);
  c.args.push_back(ws);
  return c;
}
void call_linear_workspace(const Bound& b) {
  linear(b.t("x"), b.t("x_scale"), b.t("w"), b.t("w_scale"), b.t("y"), b.t("workspace"), nullptr);
}

// ---- batched_linear: per-batch weights; the batch may be the heads of a [T, B, K] activation ----
Case make_batched_linear(Rng& rng) {
  Case c;
  const DType t = float_dtype(rng);
  const int64_t B = draw(rng, 1, 4), T = draw(rng, 1, 5), K = draw_of<int64_t>(rng, {16, 64}),
                N = draw_of<int64_t>(rng, {8, 32});
  Arg x = real("x", t, {B, T, K});
  if (coin(rng)) x.strides = {K, B * K, 1};  // heads of a [T, B, K] row
  c.args.push_back(x);
  c.args.push_back(real("w", t, {B, N, K}));
  Arg y = output("y", t == DType::fp32 ? DType::fp32 : float_dtype(rng), {B, T, N});
  if (coin(rng)) y.strides = {N, B * N, 1};
  c.args.push_back(y);
  return c;
}
void call_batched_linear(const Bound& b) { batched_linear(b.t("x"), b.t("w"), b.t("y")); }

// ---- FP8 activation quantization and block dequantization ---------------------------------------
Case make_quantize_act(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 5), K = 128 * draw(rng, 1, 2), block = draw_of<int64_t>(rng, {64, 128});
  c.args.push_back(real("x", float_dtype(rng), {T, K}));
  c.args.push_back(output("xq", DType::fp8_e4m3, {T, K}));
  Arg s = scales("scale", scale_dtype(rng), T, K / block, rng);
  s.role = Role::output;
  c.args.push_back(s);
  c.scalars.push_back({"block", static_cast<double>(block), true});
  return c;
}
void call_quantize_act(const Bound& b) {
  quantize_act_fp8(b.t("x"), static_cast<int>(b.i("block")), b.t("xq"), b.t("scale"));
}

Case make_dequantize_fp8(Rng& rng) {
  Case c;
  const int64_t R = draw(rng, 1, 9), C = draw(rng, 1, 300);
  const int64_t br = draw_of<int64_t>(rng, {1, 32, 128}), bc = draw_of<int64_t>(rng, {16, 64, 128});
  std::vector<int64_t> lead;
  if (coin(rng)) lead.push_back(draw(rng, 1, 3));
  auto with_lead = [&](std::vector<int64_t> s) {
    s.insert(s.begin(), lead.begin(), lead.end());
    return s;
  };
  c.args.push_back(real("x", DType::fp8_e4m3, with_lead({R, C})));
  c.args.push_back(real("scale", scale_dtype(rng), with_lead({(R + br - 1) / br, (C + bc - 1) / bc})));
  c.args.push_back(output("y", float_dtype(rng), with_lead({R, C})));
  c.scalars.push_back({"block_rows", static_cast<double>(br), true});
  c.scalars.push_back({"block_cols", static_cast<double>(bc), true});
  return c;
}
void call_dequantize_fp8(const Bound& b) {
  dequantize_fp8_blocks(b.t("x"), b.t("scale"), static_cast<int>(b.i("block_rows")),
                        static_cast<int>(b.i("block_cols")), b.t("y"));
}

// ---- norms ----------------------------------------------------------------------------------------
// y is a separate buffer or, a quarter of the time, the very same view as x (the in-place form).
void output_maybe_in_place(Case& c, const std::string& out, const std::string& in, Rng& rng) {
  Arg y = c.arg(in);
  y.name = out;
  y.role = Role::output;
  y.index = false;
  if (draw(rng, 0, 3) == 0) {
    y.alias_of = c.index_of(in);
  } else {
    y.dtype = float_dtype(rng);
  }
  c.args.push_back(y);
}

Case make_rms_norm(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), D = draw_of<int64_t>(rng, {64, 128, 512});
  std::vector<int64_t> shape = {T, D};
  if (coin(rng)) shape.insert(shape.begin() + 1, draw(rng, 1, 3));
  c.args.push_back(real("x", float_dtype(rng), shape));
  if (coin(rng)) c.args.push_back(real("weight", float_dtype(rng), {D}));
  output_maybe_in_place(c, "y", "x", rng);
  c.scalars.push_back({"eps", 1e-6, false});
  return c;
}
void call_rms_norm(const Bound& b) { rms_norm(b.t("x"), b.t("weight"), b.f("eps"), b.t("y")); }

Case make_fused_qkv_rms_norm(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), QL = 128 * draw(rng, 1, 2), D = draw_of<int64_t>(rng, {128, 512});
  const DType t = float_dtype(rng);
  c.args.push_back(real("q_in", t, {T, QL}));
  c.args.push_back(real("wq", float_dtype(rng), {QL}));
  c.args.push_back(real("kv_in", t, {T, D}));
  c.args.push_back(real("wkv", float_dtype(rng), {D}));
  c.args.push_back(output("q_out", float_dtype(rng), {T, QL}));
  c.args.push_back(output("kv_out", float_dtype(rng), {T, D}));
  c.scalars.push_back({"eps", 1e-6, false});
  return c;
}
void call_fused_qkv_rms_norm(const Bound& b) {
  fused_qkv_rms_norm(b.t("q_in"), b.t("wq"), b.t("kv_in"), b.t("wkv"), b.f("eps"), b.t("q_out"),
                     b.t("kv_out"));
}
Case make_fused_qkv_rms_norm_fp8(Rng& rng) {
  Case c = make_fused_qkv_rms_norm(rng);
  const int64_t T = c.arg("q_in").shape[0], QL = c.arg("q_in").shape[1];
  if (coin(rng)) c.arg("q_out").defined = false;
  c.args.push_back(output("q_fp8", DType::fp8_e4m3, {T, QL}));
  Arg s = scales("q_scale", scale_dtype(rng), T, QL / 128, rng);
  s.role = Role::output;
  c.args.push_back(s);
  return c;
}
void call_fused_qkv_rms_norm_fp8(const Bound& b) {
  fused_qkv_rms_norm(b.t("q_in"), b.t("wq"), b.t("kv_in"), b.t("wkv"), b.f("eps"), b.t("q_out"),
                     b.t("kv_out"), b.t("q_fp8"), b.t("q_scale"), nullptr);
}

Case make_residual_add_rms_norm(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), D = draw_of<int64_t>(rng, {64, 512});
  c.args.push_back(real("residual", DType::fp32, {T, D}, Role::inout));
  if (draw(rng, 0, 3)) c.args.push_back(real("delta", float_dtype(rng), {T, D}));
  if (draw(rng, 0, 3)) {  // the norm (y, optionally weighted), or the add alone
    if (coin(rng)) c.args.push_back(real("weight", float_dtype(rng), {D}));
    c.args.push_back(output("y", float_dtype(rng), {T, D}));
  }
  c.scalars.push_back({"eps", 1e-6, false});
  return c;
}
void call_residual_add_rms_norm(const Bound& b) {
  residual_add_rms_norm(b.t("residual"), b.t("delta"), b.t("weight"), b.f("eps"), b.t("y"));
}

// ---- RoPE -----------------------------------------------------------------------------------------
Arg positions(int64_t T, int64_t max_pos, Rng& rng) {
  return ints("positions", draw_of(rng, {DType::int32, DType::int64}), {T}, 0, max_pos - 1);
}

Case make_apply_rope(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), D = draw_of<int64_t>(rng, {64, 128, 512}), P = draw(rng, 1, 40);
  std::vector<int64_t> shape = {T, D};
  if (coin(rng)) shape.insert(shape.begin() + 1, draw(rng, 1, 3));
  c.args.push_back(real("x", float_dtype(rng), shape));
  c.args.push_back(positions(T, P, rng));
  c.args.push_back(rope_table(P));
  output_maybe_in_place(c, "y", "x", rng);
  c.scalars.push_back({"inverse", static_cast<double>(coin(rng)), true});
  return c;
}
void call_apply_rope(const Bound& b) {
  apply_rope(b.t("x"), b.t("positions"), b.t("cos_sin"), b.i("inverse") != 0, b.t("y"));
}

Case make_inv_rope_fp8_quant(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), H = draw(rng, 1, 2), D = draw_of<int64_t>(rng, {128, 512}),
                P = draw(rng, 1, 40), block = draw_of<int64_t>(rng, {64, 128});
  c.args.push_back(real("o", DType::bf16, {T, H, D}));
  c.args.push_back(positions(T, P, rng));
  c.args.push_back(rope_table(P));
  c.args.push_back(output("o_fp8", DType::fp8_e4m3, {T, H * D}));
  Arg s = scales("o_scale", scale_dtype(rng), T, H * D / block, rng);
  s.role = Role::output;
  c.args.push_back(s);
  c.scalars.push_back({"block", static_cast<double>(block), true});
  return c;
}
void call_inv_rope_fp8_quant(const Bound& b) {
  inv_rope_fp8_quant(b.t("o"), b.t("positions"), b.t("cos_sin"), static_cast<int>(b.i("block")),
                     b.t("o_fp8"), b.t("o_scale"));
}

// ---- output projection ----------------------------------------------------------------------------
Case make_grouped_wo_a(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 4), G = draw(rng, 1, 2), per_group = draw_of<int64_t>(rng, {64, 128}),
                L = draw_of<int64_t>(rng, {8, 16});
  const DType t = float_dtype(rng);
  c.args.push_back(real("o", t, {T, G * per_group}));
  c.args.push_back(real("wo_a", t, {G, L, per_group}));
  c.args.push_back(output("z", t == DType::fp32 ? DType::fp32 : float_dtype(rng), {T, G * L}));
  return c;
}
void call_grouped_wo_a(const Bound& b) {
  grouped_wo_a(b.t("o"), b.t("o_scale"), b.t("wo_a"), b.t("wo_a_scale"), b.t("z"));
}

// ---- synthetic hidden states ------------------------------------------------------------------------
Case make_synthetic_hidden(Rng& rng) {
  Case c;
  const int64_t T = draw(rng, 1, 5);
  c.args.push_back(ints("req_ids", DType::int64, {T}, 0, 9));
  c.args.push_back(ints("positions", DType::int64, {T}, 0, 1000));
  c.args.push_back(output("out", float_dtype(rng), {T, draw_of<int64_t>(rng, {8, 64})}));
  c.scalars.push_back({"seed", static_cast<double>(draw(rng, 0, 1000)), true});
  return c;
}
void call_synthetic_hidden(const Bound& b) {
  synthetic_hidden(b.t("req_ids"), b.t("positions"), static_cast<uint64_t>(b.i("seed")), b.t("out"));
}

}  // namespace

void add_dense_ops(std::vector<OpSpec>& ops) {
  ops.push_back({"linear", make_linear, call_linear});
  ops.push_back({"linear+workspace", make_linear_workspace, call_linear_workspace});
  ops.push_back({"batched_linear", make_batched_linear, call_batched_linear});
  ops.push_back({"quantize_act_fp8", make_quantize_act, call_quantize_act});
  ops.push_back({"dequantize_fp8_blocks", make_dequantize_fp8, call_dequantize_fp8});
  ops.push_back({"rms_norm", make_rms_norm, call_rms_norm});
  ops.push_back({"fused_qkv_rms_norm", make_fused_qkv_rms_norm, call_fused_qkv_rms_norm});
  ops.push_back({"fused_qkv_rms_norm+fp8", make_fused_qkv_rms_norm_fp8, call_fused_qkv_rms_norm_fp8});
  ops.push_back({"residual_add_rms_norm", make_residual_add_rms_norm, call_residual_add_rms_norm});
  ops.push_back({"apply_rope", make_apply_rope, call_apply_rope});
  ops.push_back({"inv_rope_fp8_quant", make_inv_rope_fp8_quant, call_inv_rope_fp8_quant});
  ops.push_back({"grouped_wo_a", make_grouped_wo_a, call_grouped_wo_a});
  ops.push_back({"synthetic_hidden", make_synthetic_hidden, call_synthetic_hidden});
}

}  // namespace dsv4::fuzz
