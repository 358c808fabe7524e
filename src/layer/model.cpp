#include "dsv4/model.h"

#include <exception>
#include <sstream>
#include <thread>

#include "dsv4/ops.h"
#include "dsv4/safetensors.h"
#include "dsv4/sparse_mla_weights.h"
#include "dsv4/status.h"
#include "dsv4/tensor_parallel.h"
#include "dsv4/weights.h"
#include "layer/rank_threads.h"
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

struct AttentionStack::Rank {
  // A GPU rank of a multi-GPU stack: its CUDA device, current while anything of it is built,
  // run or freed. -1: the caller's current device (one GPU) or the CPU.
  int device = -1;
  std::vector<Attention> layers;                // V4: this rank's shard of every layer
  std::unique_ptr<rt::OwnedStream> own_stream;  // GPU ranks 1..: the stream they run on
  Stream stream = nullptr;
  // The residual stream's buffers (grown on demand): on the host for the CPU backend, on the
  // rank's GPU for CUDA.
  int64_t capacity_rows = 0;
  HostTensor residual, normed, out;
  DeviceTensor residual_dev, normed_dev, out_dev;

  // Grows the residual stream's buffers to `rows` tokens (only ever up, so steady steps and a
  // step within reserve()'s bounds allocate nothing). On the GPU the normed input is bf16 (what
  // the GEMMs take); on the CPU fp32.
  void ensure_rows(int64_t rows, int64_t dim, Device on) {
    if (capacity_rows >= rows) return;
    const DType normed_dtype = on == Device::cuda ? DType::bf16 : DType::fp32;
    if (on == Device::cuda) {
      residual_dev = DeviceTensor(DType::fp32, {rows, dim});
      normed_dev = DeviceTensor(normed_dtype, {rows, dim});
      out_dev = DeviceTensor(DType::fp32, {rows, dim});
    } else {
      residual = HostTensor(DType::fp32, {rows, dim});
      normed = HostTensor(normed_dtype, {rows, dim});
      out = HostTensor(DType::fp32, {rows, dim});
    }
    capacity_rows = rows;
  }
  // A multi-GPU stack's x lives on GPU 0: rank 0 records x_ready on its stream once x is there,
  // rank r > 0 copies x after it and records x_copied, which rank 0's stream waits for before
  // the caller may reuse x.
  rt::Event x_ready, x_copied;

  explicit Rank(int dev) : device(dev) {}
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;
  ~Rank() {
    try {
      const rt::DeviceGuard on_device(device, "AttentionStack");
      free_resources();
    } catch (...) {
      free_resources();  // the device could not be made current: free from here anyway
    }
  }

 private:
  void free_resources() noexcept {
    layers.clear();
    residual_dev = DeviceTensor();
    normed_dev = DeviceTensor();
    out_dev = DeviceTensor();
    x_ready = rt::Event();
    x_copied = rt::Event();
    own_stream.reset();
  }
};

AttentionStack::AttentionStack(const ModelConfig& cfg, const StackOptions& opts) : cfg_(cfg) {
  cfg.validate();
  std::vector<int> ids = opts.layers;
  if (ids.empty())
    for (int l = 0; l < cfg.n_layers(); ++l) ids.push_back(l);
  std::unique_ptr<Checkpoint> ckpt;
  if (!opts.weights_dir.empty()) ckpt = std::make_unique<Checkpoint>(Checkpoint::open(opts.weights_dir));
  if (sparse_mla()) {
    if (opts.tp != 1)
      fail_expected("AttentionStack", "tp", "1 for DeepSeek-V3.2 (its sparse-MLA layer has no "
                    "tensor-parallel split)", opts.tp);
    SparseMlaOptions mo;
    mo.backend = opts.attention.backend;
    mo.stream = opts.attention.stream;
    mo.fp8_activations = opts.attention.fp8_activations;
    mo.fp8_gemm_activations = opts.attention.fp8_gemm_activations;
    mo.cache_blocks = opts.attention.caches.swa_blocks;
    mo.block_size = opts.attention.caches.swa_block_size;
    mo.num_sms = opts.attention.num_sms;
    mo.cuda_graphs = opts.attention.cuda_graphs;
    mla_layers_.reserve(ids.size());
    for (int l : ids) {
      SparseMlaWeights w = ckpt ? load_sparse_mla_weights(*ckpt, cfg, l)
                                : random_sparse_mla_weights(cfg, l, opts.seed, opts.fp8_weights);
      mla_layers_.emplace_back(cfg, l, std::move(w), mo);
    }
    ranks_.push_back(std::make_unique<Rank>(-1));  // the residual stream
    ranks_.back()->stream = opts.attention.stream;
    return;
  }
  const int tp = opts.tp;
  if (tp < 1) fail_expected("AttentionStack", "tp", ">= 1", tp);
  check_tensor_parallel(cfg, {0, tp, nullptr}, "AttentionStack: tp");
  // tp > 1 on CUDA: rank r on GPU r, the ranks summing y through one NCCL group.
  const bool gpu_ranks = tp > 1 && opts.attention.backend == Backend::cuda;
  std::vector<int> devices;
  if (gpu_ranks) {
    const size_t visible = rt::devices(nullptr).size();
    if (visible < static_cast<size_t>(tp))
      fail_expected("AttentionStack", "tp", "at most the " + std::to_string(visible) +
                    " visible GPU(s) on the CUDA backend (rank r runs on GPU r)", tp);
    for (int r = 0; r < tp; ++r) devices.push_back(r);
    tp_group_ = make_nccl_group(devices);  // throws, saying why, in a build without NCCL
  } else if (tp > 1) {
    tp_group_ = make_in_process_group(tp);
  }
  if (tp > 1) rank_threads_ = std::make_unique<RankThreads>(tp, devices);
  for (int r = 0; r < tp; ++r) {
    ranks_.push_back(std::make_unique<Rank>(gpu_ranks ? r : -1));
    Rank& rank = *ranks_.back();
    if (r == 0) {
      rank.stream = opts.attention.stream;
    } else if (gpu_ranks) {
      const rt::DeviceGuard on_device(rank.device, "AttentionStack");
      rank.own_stream = std::make_unique<rt::OwnedStream>();
      rank.stream = rank.own_stream->get();
    }
    rank.layers.reserve(ids.size());
  }
  for (int l : ids) {
    AttentionWeights w = ckpt ? load_attention_weights(*ckpt, cfg, l)
                              : random_attention_weights(cfg, l, opts.seed, opts.fp8_weights);
    for (int r = 0; r < tp; ++r) {
      Rank& rank = *ranks_[static_cast<size_t>(r)];
      AttentionOptions rank_opts = opts.attention;
      rank_opts.stream = rank.stream;
      if (tp > 1) rank_opts.tp = {r, tp, tp_group_[static_cast<size_t>(r)].get()};
      const rt::DeviceGuard on_device(rank.device, "AttentionStack");  // weights, caches on its GPU
      rank.layers.emplace_back(cfg, l, w, rank_opts);
    }
    if (tp > 1) whole_weights_.push_back(std::move(w));
  }
}

AttentionStack::~AttentionStack() = default;
AttentionStack::AttentionStack(AttentionStack&&) noexcept = default;
AttentionStack& AttentionStack::operator=(AttentionStack&&) noexcept = default;

const AttentionWeights& AttentionStack::layer_weights(int i) const {
  if (sparse_mla())
    fail("AttentionStack::layer_weights: config '", cfg_.name, "' is DeepSeek-V3.2 (use sparse_mla_layer)");
  return whole_weights_.empty() ? ranks_.at(0)->layers.at(static_cast<size_t>(i)).weights()
                                : whole_weights_.at(static_cast<size_t>(i));
}

int AttentionStack::num_layers() const {
  return static_cast<int>(sparse_mla() ? mla_layers_.size() : ranks_.empty() ? 0 : ranks_[0]->layers.size());
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
  // Every layer of every rank accepts the step before the first one changes its caches (and
  // before any rank enters a collective).
  for (const std::unique_ptr<Rank>& rank : ranks_)
    for (const Attention& a : rank->layers) a.check_plan(plan);
  for (const SparseMlaAttention& a : mla_layers_) a.check_plan(plan);
  if (T == 0) return;
  if (!rank_threads_) {
    forward_rank(0, plan, x, y, layer_io);
    return;
  }
  Rank& first = *ranks_[0];
  const bool peer_input = first.device >= 0 && x.device == Device::cuda;  // x on GPU 0
  if (peer_input) {
    const rt::DeviceGuard on_device(first.device, kWhere);
    first.x_ready.record(first.stream);
  }
  rank_threads_->run([&](int r) {
    forward_rank(r, plan, x, r == 0 ? y : TensorView(), r == 0 ? layer_io : nullptr);
  });
  if (peer_input) {
    const rt::DeviceGuard on_device(first.device, kWhere);
    for (size_t r = 1; r < ranks_.size(); ++r) ranks_[r]->x_copied.make_wait(first.stream);
  }
}

void AttentionStack::forward_rank(int r, const BatchPlan& plan, const TensorView& x, const TensorView& y,
                                  std::vector<LayerIO>* layer_io) {
  constexpr const char* kWhere = "AttentionStack::forward";
  Rank& rank = *ranks_[static_cast<size_t>(r)];
  const int64_t T = plan.num_tokens();
  const int64_t dim = cfg_.dim;
  const Device device = backend() == Backend::cpu ? Device::cpu : Device::cuda;
  // The residual h, the normed layer input and the layer output live on the rank's device.
  const Stream stream = rank.stream;
  rank.ensure_rows(T, dim, device);
  auto rows = [&](const OwnedTensor& host, const DeviceTensor& dev) {
    const OwnedTensor& t = device == Device::cuda ? static_cast<const OwnedTensor&>(dev) : host;
    return TensorView(t.view().data, t.dtype(), {T, dim}, device);
  };
  const TensorView h = rows(rank.residual, rank.residual_dev);
  const TensorView normed = rows(rank.normed, rank.normed_dev);
  const TensorView out = rows(rank.out, rank.out_dev);
  const size_t bytes = static_cast<size_t>(T * dim) * sizeof(float);
  if (device == Device::cpu) {
    std::copy(x.ptr<float>(), x.ptr<float>() + T * dim, h.ptr<float>());
  } else if (x.device == Device::cpu) {
    rt::copy_host_to_device_async(h.data, x.data, bytes, stream);
  } else if (r > 0 && rank.device >= 0) {  // x is on GPU 0 (the caller's): copy it over
    const Rank& first = *ranks_[0];
    first.x_ready.make_wait(stream);
    rt::copy_peer_async(h.data, rank.device, x.data, first.device, bytes, stream);
    rank.x_copied.record(stream);
  } else {
    rt::copy_device_to_device_async(h.data, x.data, bytes, stream);
  }

  const size_t n_layers = static_cast<size_t>(num_layers());
  if (layer_io) layer_io->assign(n_layers, {});
  const float eps = static_cast<float>(cfg_.norm_eps);
  for (size_t l = 0; l < n_layers; ++l) {
    // h ← h + out of the previous layer (none before the first), normed = RMSNorm(h).
    residual_add_rms_norm(h, l == 0 ? TensorView() : out, {}, eps, normed, stream);
    if (sparse_mla())
      mla_layers_[l].forward(plan, normed, out);
    else
      rank.layers[l].forward(plan, normed, out);  // with tp > 1 its y is the sum over the ranks
    if (layer_io) {
      LayerIO& io = (*layer_io)[l];
      io.in = HostTensor(DType::fp32, {T, dim});
      io.out = HostTensor(DType::fp32, {T, dim});
      if (device == Device::cuda) {
        rt::synchronize_stream(stream, kWhere);  // the copies below run on no stream of ours
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
  if (!y.data) return;  // ranks 1..: rank 0 reports the (identical) output
  residual_add_rms_norm(h, out, {}, eps, {}, stream);  // the last layer's residual add
  if (device == Device::cpu) {
    std::copy(h.ptr<float>(), h.ptr<float>() + T * dim, y.ptr<float>());
  } else if (y.device == Device::cuda) {
    rt::copy_device_to_device_async(y.data, h.data, bytes, stream);
  } else {
    rt::synchronize_stream(stream, kWhere);
    copy_to_host(h, y);
  }
}

std::vector<LayerMemory> AttentionStack::reserve(int64_t max_tokens, int max_requests, int64_t max_context) {
  // Each rank on its own device (-1: the caller's); rank 0's layers are reported, the others hold
  // the same sizes on theirs. A V3.2 stack is one rank whose layers are mla_layers_.
  std::vector<LayerMemory> memory;
  const Device device = backend() == Backend::cpu ? Device::cpu : Device::cuda;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = *ranks_[r];
    const rt::DeviceGuard on_device(rank.device, "AttentionStack::reserve");
    for (Attention& a : rank.layers) {
      const LayerMemory m = a.reserve(max_tokens, max_requests, max_context);
      if (r == 0) memory.push_back(m);
    }
    if (r == 0)
      for (SparseMlaAttention& a : mla_layers_) memory.push_back(a.reserve(max_tokens, max_requests, max_context));
    rank.ensure_rows(max_tokens, cfg_.dim, device);
  }
  return memory;
}

void AttentionStack::set_stream(Stream stream) {
  if (ranks_.empty()) return;
  ranks_[0]->stream = stream;
  for (Attention& a : ranks_[0]->layers) a.set_stream(stream);
  for (SparseMlaAttention& a : mla_layers_) a.set_stream(stream);
}

void AttentionStack::release(int64_t req_id) {
  for (const std::unique_ptr<Rank>& rank : ranks_)
    for (Attention& a : rank->layers) a.release(req_id);
  for (SparseMlaAttention& a : mla_layers_) a.release(req_id);
}

Attention& AttentionStack::layer(int i) {
  if (sparse_mla())
    fail("AttentionStack::layer: config '", cfg_.name,
         "' is DeepSeek-V3.2; its layers are SparseMlaAttention (sparse_mla_layer)");
  return ranks_.at(0)->layers.at(static_cast<size_t>(i));
}

SparseMlaAttention& AttentionStack::sparse_mla_layer(int i) {
  if (!sparse_mla())
    fail("AttentionStack::sparse_mla_layer: config '", cfg_.name, "' is DeepSeek-V4 (use layer)");
  return mla_layers_.at(static_cast<size_t>(i));
}

int AttentionStack::layer_index(int i) const {
  return sparse_mla() ? mla_layers_.at(static_cast<size_t>(i)).layer_index()
                      : ranks_.at(0)->layers.at(static_cast<size_t>(i)).layer_index();
}

LayerKind AttentionStack::layer_kind(int i) const { return cfg_.layer_kind(layer_index(i)); }

Backend AttentionStack::backend() const {
  if (sparse_mla()) return mla_layers_.empty() ? Backend::cpu : mla_layers_[0].backend();
  return ranks_.empty() || ranks_[0]->layers.empty() ? Backend::cpu : ranks_[0]->layers[0].backend();
}

}  // namespace dsv4
