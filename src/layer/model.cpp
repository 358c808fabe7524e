#include "dsv4/model.h"

#include <exception>
#include <sstream>
#include <thread>

#include "dsv4/ops.h"
#include "dsv4/safetensors.h"
#include "dsv4/sparse_mla_weights.h"
#include "dsv4/status.h"
#include "dsv4/weights.h"
#include "runtime/device_runtime.h"

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
  stream_ = opts.attention.stream;
  if (sparse_mla()) {
    SparseMlaOptions mo;
    mo.backend = opts.attention.backend;
    mo.stream = opts.attention.stream;
    mo.fp8_activations = opts.attention.fp8_activations;
    mo.fp8_gemm_activations = opts.attention.fp8_gemm_activations;
    mo.cache_blocks = opts.attention.caches.swa_blocks;
    mo.block_size = opts.attention.caches.swa_block_size;
    mo.num_sms = opts.attention.num_sms;
    mla_layers_.reserve(ids.size());
    for (int l : ids) {
      SparseMlaWeights w = ckpt ? load_sparse_mla_weights(*ckpt, cfg, l)
                                : random_sparse_mla_weights(cfg, l, opts.seed, opts.fp8_weights);
      mla_layers_.emplace_back(cfg, l, std::move(w), mo);
    }
    return;
  }
  if (opts.tp < 1) fail_expected("AttentionStack", "tp", ">= 1", opts.tp);
  if (opts.tp > 1 && opts.attention.backend != Backend::cpu)
    fail("AttentionStack: tp ", opts.tp, ": expected the CPU backend (tensor parallelism over "
         "GPUs takes one Attention per GPU with an NCCL group, make_nccl_group; the stack "
         "emulates ranks on the CPU only)");
  if (opts.tp > 1) {
    tp_group_ = make_in_process_group(opts.tp);
    peers_.resize(static_cast<size_t>(opts.tp - 1));
  }
  layers_.reserve(ids.size());
  for (int l : ids) {
    AttentionWeights w = ckpt ? load_attention_weights(*ckpt, cfg, l)
                              : random_attention_weights(cfg, l, opts.seed, opts.fp8_weights);
    for (int r = 0; r < opts.tp; ++r) {
      AttentionOptions rank_opts = opts.attention;
      if (opts.tp > 1) rank_opts.tp = {r, opts.tp, tp_group_[static_cast<size_t>(r)].get()};
      (r == 0 ? layers_ : peers_[static_cast<size_t>(r - 1)]).emplace_back(cfg, l, w, rank_opts);
    }
    if (opts.tp > 1) whole_weights_.push_back(std::move(w));
  }
}

// Ranks 1.. on threads of their own while rank 0 runs here; each rank's forward ends with the
// group's sum of y, so every rank's y holds the layer's output. An error of any rank is rethrown
// (the plan was checked on every rank before, so an error is a bug, not bad input).
void AttentionStack::forward_ranks(size_t l, const BatchPlan& plan, const TensorView& x,
                                   const TensorView& y) {
  std::vector<std::exception_ptr> errors(peers_.size() + 1);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < peers_.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        peers_[r][l].forward(plan, x, peer_out_[r].view().slice0(0, plan.num_tokens()));
      } catch (...) {
        errors[r + 1] = std::current_exception();
      }
    });
  try {
    layers_[l].forward(plan, x, y);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

const AttentionWeights& AttentionStack::layer_weights(int i) const {
  if (sparse_mla())
    fail("AttentionStack::layer_weights: config '", cfg_.name, "' is DeepSeek-V3.2 (use sparse_mla_layer)");
  return peers_.empty() ? layers_.at(static_cast<size_t>(i)).weights()
                        : whole_weights_.at(static_cast<size_t>(i));
}

void AttentionStack::forward(const BatchPlan& plan, const TensorView& x, const TensorView& y,
                             std::vector<LayerIO>* layer_io) {
  const int64_t T = plan.num_tokens();
  const int64_t dim = cfg_.dim;
  constexpr const char* kWhere = "AttentionStack::forward";
  const Device device = backend() == Backend::cpu ? Device::cpu : Device::cuda;
  for (const auto& [name, t] : {std::pair{"x", x}, std::pair{"y", y}}) {
    if (t.device != Device::cpu && t.device != device)
      fail_expected(kWhere, std::string(name) + ".device", "cpu or the layers' device", "cuda");
    check_shape(kWhere, name, t, {T, dim});
    check_dtype(kWhere, name, t, DType::fp32);
    check_contiguous(kWhere, name, t);
  }
  // Every layer accepts the step before the first one changes its caches.
  for (const Attention& a : layers_) a.check_plan(plan);
  for (const std::vector<Attention>& rank : peers_)
    for (const Attention& a : rank) a.check_plan(plan);
  for (const SparseMlaAttention& a : mla_layers_) a.check_plan(plan);
  if (T == 0) return;

  // The residual h, the normed layer input and the layer output live on the layers' device; the
  // buffers only grow, so steady steps allocate nothing. On the GPU the normed input is bf16 (what
  // the GEMMs take); on the CPU fp32.
  const Stream stream = stream_;
  const DType normed_dtype = device == Device::cuda ? DType::bf16 : DType::fp32;
  if (capacity_rows_ < T) {
    if (device == Device::cuda) {
      residual_dev_ = DeviceTensor(DType::fp32, {T, dim});
      normed_dev_ = DeviceTensor(normed_dtype, {T, dim});
      out_dev_ = DeviceTensor(DType::fp32, {T, dim});
    } else {
      residual_ = HostTensor(DType::fp32, {T, dim});
      normed_ = HostTensor(normed_dtype, {T, dim});
      out_ = HostTensor(DType::fp32, {T, dim});
      peer_out_.assign(peers_.size(), HostTensor());
      for (HostTensor& t : peer_out_) t = HostTensor(DType::fp32, {T, dim});
    }
    capacity_rows_ = T;
  }
  auto rows = [&](const OwnedTensor& host, const DeviceTensor& dev) {
    const OwnedTensor& t = device == Device::cuda ? static_cast<const OwnedTensor&>(dev) : host;
    return TensorView(t.view().data, t.dtype(), {T, dim}, device);
  };
  const TensorView h = rows(residual_, residual_dev_);
  const TensorView normed = rows(normed_, normed_dev_);
  const TensorView out = rows(out_, out_dev_);
  const size_t bytes = static_cast<size_t>(T * dim) * sizeof(float);
  if (device == Device::cpu)
    std::copy(x.ptr<float>(), x.ptr<float>() + T * dim, h.ptr<float>());
  else if (x.device == Device::cuda)
    rt::copy_device_to_device_async(h.data, x.data, bytes, stream);
  else
    copy_to_device(x, h);

  const size_t n_layers = static_cast<size_t>(num_layers());
  if (layer_io) layer_io->assign(n_layers, {});
  const float eps = static_cast<float>(cfg_.norm_eps);
  for (size_t l = 0; l < n_layers; ++l) {
    // h ← h + out of the previous layer (none before the first), normed = RMSNorm(h).
    residual_add_rms_norm(h, l == 0 ? TensorView() : out, {}, eps, normed, stream);
    if (sparse_mla())
      mla_layers_[l].forward(plan, normed, out);
    else if (!peers_.empty())
      forward_ranks(l, plan, normed, out);
    else
      layers_[l].forward(plan, normed, out);
    if (layer_io) {
      LayerIO& io = (*layer_io)[l];
      io.in = HostTensor(DType::fp32, {T, dim});
      io.out = HostTensor(DType::fp32, {T, dim});
      if (device == Device::cuda) {
        HostTensor in_bf16(normed.dtype, {T, dim});
        copy_to_host(normed, in_bf16);
        io.in = HostTensor::copy_of(in_bf16, DType::fp32);
        copy_to_host(out, io.out);
      } else {
        std::copy(normed.ptr<float>(), normed.ptr<float>() + T * dim, io.in.data<float>());
        std::copy(out.ptr<float>(), out.ptr<float>() + T * dim, io.out.data<float>());
      }
    }
  }
  residual_add_rms_norm(h, out, {}, eps, {}, stream);  // the last layer's residual add
  if (device == Device::cpu)
    std::copy(h.ptr<float>(), h.ptr<float>() + T * dim, y.ptr<float>());
  else if (y.device == Device::cuda)
    rt::copy_device_to_device_async(y.data, h.data, bytes, stream);
  else
    copy_to_host(h, y);
}

void AttentionStack::set_stream(Stream stream) {
  stream_ = stream;
  for (Attention& a : layers_) a.set_stream(stream);
  for (SparseMlaAttention& a : mla_layers_) a.set_stream(stream);
}

void AttentionStack::release(int64_t req_id) {
  for (Attention& a : layers_) a.release(req_id);
  for (std::vector<Attention>& rank : peers_)
    for (Attention& a : rank) a.release(req_id);
  for (SparseMlaAttention& a : mla_layers_) a.release(req_id);
}

Attention& AttentionStack::layer(int i) {
  if (sparse_mla())
    fail("AttentionStack::layer: config '", cfg_.name,
         "' is DeepSeek-V3.2; its layers are SparseMlaAttention (sparse_mla_layer)");
  return layers_.at(static_cast<size_t>(i));
}

SparseMlaAttention& AttentionStack::sparse_mla_layer(int i) {
  if (!sparse_mla())
    fail("AttentionStack::sparse_mla_layer: config '", cfg_.name, "' is DeepSeek-V4 (use layer)");
  return mla_layers_.at(static_cast<size_t>(i));
}

int AttentionStack::layer_index(int i) const {
  return sparse_mla() ? mla_layers_.at(static_cast<size_t>(i)).layer_index()
                      : layers_.at(static_cast<size_t>(i)).layer_index();
}

LayerKind AttentionStack::layer_kind(int i) const { return cfg_.layer_kind(layer_index(i)); }

Backend AttentionStack::backend() const {
  if (sparse_mla()) return mla_layers_.empty() ? Backend::cpu : mla_layers_[0].backend();
  return layers_.empty() ? Backend::cpu : layers_[0].backend();
}

}  // namespace dsv4
