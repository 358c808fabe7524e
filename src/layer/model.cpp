#include "dsv4/model.h"

#include <sstream>

#include "dsv4/ops.h"
#include "dsv4/safetensors.h"
#include "dsv4/status.h"
#include "dsv4/weights.h"

namespace dsv4 {

std::vector<int> parse_layer_list(const std::string& spec, int n_layers) {
  std::vector<int> out;
  std::stringstream ss(spec);
  std::string item;
  auto parse_int = [&](const std::string& s) {
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != s.size() || s.empty()) fail("--layers: '", s, "' is not a layer number");
    if (v < 0 || v >= n_layers)
      fail_expected("--layers", "layer " + s, "0.." + std::to_string(n_layers - 1), v);
    return v;
  };
  while (std::getline(ss, item, ',')) {
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(parse_int(item));
    } else {
      const int a = parse_int(item.substr(0, dash)), b = parse_int(item.substr(dash + 1));
      if (b < a) fail("--layers: empty range '", item, "'");
      for (int l = a; l <= b; ++l) out.push_back(l);
    }
  }
  if (out.empty()) fail("--layers: no layer given in '", spec, "'");
  return out;
}

AttentionStack::AttentionStack(const ModelConfig& cfg, const StackOptions& opts) : cfg_(cfg) {
  cfg.validate();
  std::vector<int> ids = opts.layers;
  if (ids.empty())
    for (int l = 0; l < cfg.n_layers(); ++l) ids.push_back(l);
  std::unique_ptr<Checkpoint> ckpt;
  if (!opts.weights_dir.empty()) ckpt = std::make_unique<Checkpoint>(Checkpoint::open(opts.weights_dir));
  layers_.reserve(ids.size());
  for (int l : ids) {
    AttentionWeights w = ckpt ? load_attention_weights(*ckpt, cfg, l)
                              : random_attention_weights(cfg, l, opts.seed, opts.fp8_weights);
    layers_.emplace_back(cfg, l, std::move(w), opts.attention);
  }
}

void AttentionStack::forward(const BatchPlan& plan, const TensorView& x, const TensorView& y,
                             std::vector<LayerIO>* layer_io) {
  const int64_t T = plan.num_tokens();
  constexpr const char* kWhere = "AttentionStack::forward";
  for (const auto& [name, t] : {std::pair{"x", x}, std::pair{"y", y}}) {
    check_device(kWhere, name, t, Device::cpu);  // the residual stream lives on the host
    check_shape(kWhere, name, t, {T, cfg_.dim});
    check_dtype(kWhere, name, t, DType::fp32);
    check_contiguous(kWhere, name, t);
  }
  // Every layer accepts the step before the first one changes its caches.
  for (const Attention& a : layers_) a.check_plan(plan);
  HostTensor h(DType::fp32, {T, cfg_.dim}), normed(DType::fp32, {T, cfg_.dim}),
      out(DType::fp32, {T, cfg_.dim});
  std::copy(x.ptr<float>(), x.ptr<float>() + T * cfg_.dim, h.data<float>());
  if (layer_io) layer_io->assign(layers_.size(), {});
  for (size_t l = 0; l < layers_.size(); ++l) {
    rms_norm(h, {}, static_cast<float>(cfg_.norm_eps), normed);
    layers_[l].forward(plan, normed, out);
    if (layer_io) {
      (*layer_io)[l].in = HostTensor(DType::fp32, {T, cfg_.dim});
      (*layer_io)[l].out = HostTensor(DType::fp32, {T, cfg_.dim});
      std::copy(normed.data<float>(), normed.data<float>() + T * cfg_.dim, (*layer_io)[l].in.data<float>());
      std::copy(out.data<float>(), out.data<float>() + T * cfg_.dim, (*layer_io)[l].out.data<float>());
    }
    float* hp = h.data<float>();
    const float* op = out.data<float>();
    for (int64_t i = 0; i < T * cfg_.dim; ++i) hp[i] += op[i];
  }
  std::copy(h.data<float>(), h.data<float>() + T * cfg_.dim, y.ptr<float>());
}

void AttentionStack::release(int64_t req_id) {
  for (Attention& a : layers_) a.release(req_id);
}

}  // namespace dsv4
