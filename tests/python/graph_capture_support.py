"""The caller's CUDA-graph check shared by the layer tests (test_layer_graphs.py,
test_sparse_mla_graphs.py): a decode step captured with torch.cuda.graph on a side stream, as a
serving engine captures it, replayed with new inputs copied into the captured tensor, must match
an eager twin layer running the same step on those inputs, bit for bit."""
import torch


def expect_capture_replays_like_eager(layer_before_step, step, make_x):
    """layer_before_step(): a fresh layer that has run the steps before `step` (one of them eager
    at `step`'s shape, which sizes the workspaces); make_x(seed): an input of `step`'s shape."""
    a = layer_before_step()
    x_static = make_x(2)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            y_static = a.forward(step, x_static)
    torch.cuda.current_stream().wait_stream(s)
    for seed in (3, 4):
        x_new = make_x(seed)
        x_static.copy_(x_new)
        g.replay()
        # An eager twin runs the same step (same positions and slots) on the new input.
        want = layer_before_step().forward(step, x_new)
        torch.cuda.synchronize()
        assert torch.isfinite(y_static).all()
        assert torch.equal(y_static, want), f"replay with seed {seed} differs from eager"
