"""The CUDA rotary_embedding kernel against the CPU implementation, bitwise (both round each
product and the sum in float, then once to the storage dtype): every dtype, forward and backward,
the transposed projection layout (16-byte path) and layouts that take the element path (odd
half head_dim, misaligned storage, strided heads, a non-unit last stride), cos of batch 1, tables
with distinct halves, output strides, gradients through autograd (including cos / sin and an
unused output), no host synchronization, CUDA graphs, torch.compile, the argument errors of the
CPU backend, and a converted Llama with fuse_rope=True matching the unfused model."""

from __future__ import annotations

import copy

import pytest
import torch

from cuda_helpers import CUDA_MARKS
from cutlass_nn import functional as F
from cutlass_nn import ops

pytestmark = CUDA_MARKS

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(x):
    return x.contiguous().view(INT_VIEW[x.dtype.itemsize])


def tables(batch, seq, dim, dtype, seed=0, repeat=True, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 8192, (batch, seq), generator=gen).to(torch.float64)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs if repeat else freqs * 0.7 + 0.3), dim=-1)
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


def projection_view(batch, seq, heads, dim, dtype, seed, offset=0):
    gen = torch.Generator().manual_seed(seed)
    flat = torch.randn(batch * seq * heads * dim + offset, generator=gen, dtype=torch.float64)
    flat = flat.to(dtype).cuda()[offset:]
    return flat.view(batch, seq, heads, dim).transpose(1, 2)


def cpu_copy(a):
    """a on the CPU with a's strides (Tensor.cpu() makes a non-dense tensor dense)."""
    return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype).copy_(a)


def assert_bitwise_like_cpu(fn, *args):
    got = fn(*args)
    want = fn(*[cpu_copy(a) for a in args])
    for g, w in zip(got, want):
        assert g.device.type == "cuda" and g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(bits(g.cpu()), bits(w))


LAYOUTS = {
    # name: (q, k) makers for (batch, seq, dim, dtype, seed)
    "projection_view": lambda b, s, d, dt, sd: (projection_view(b, s, 8, d, dt, sd), projection_view(b, s, 2, d, dt, sd + 1)),
    "contiguous": lambda b, s, d, dt, sd: (projection_view(b, s, 8, d, dt, sd).contiguous(), projection_view(b, s, 2, d, dt, sd + 1).contiguous()),
    "misaligned": lambda b, s, d, dt, sd: (projection_view(b, s, 8, d, dt, sd, offset=1), projection_view(b, s, 2, d, dt, sd + 1, offset=3)),
    "strided_heads": lambda b, s, d, dt, sd: (projection_view(b, s, 8, d, dt, sd)[:, ::2], projection_view(b, s, 2, d, dt, sd + 1)),
    "strided_last": lambda b, s, d, dt, sd: (projection_view(b, s, 8, 2 * d, dt, sd)[..., ::2], projection_view(b, s, 2, d, dt, sd + 1)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dim", [128, 64, 10], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_matches_cpu_bitwise(layout, dim, dtype, backward):
    q, k = LAYOUTS[layout](2, 37, dim, dtype, dim)
    cos, sin = tables(2, 37, dim, dtype, seed=dim)
    fn = ops.rotary_embedding_backward if backward else ops.rotary_embedding
    assert_bitwise_like_cpu(fn, q, k, cos, sin)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cos_of_batch_one_and_distinct_halves(dtype):
    q = projection_view(3, 64, 4, 128, dtype, 5)
    k = projection_view(3, 64, 1, 128, dtype, 6)
    cos, sin = tables(1, 64, 128, dtype, seed=7, repeat=False)
    assert_bitwise_like_cpu(ops.rotary_embedding, q, k, cos, sin)
    assert_bitwise_like_cpu(ops.rotary_embedding_backward, q, k, cos, sin)


def test_large_model_shape_matches_cpu():
    """A Llama-8B-like step: 4096 tokens, 32 query / 8 key heads of 128."""
    q = projection_view(1, 4096, 32, 128, torch.bfloat16, 8)
    k = projection_view(1, 4096, 8, 128, torch.bfloat16, 9)
    cos, sin = tables(1, 4096, 128, torch.bfloat16, seed=10)
    assert_bitwise_like_cpu(ops.rotary_embedding, q, k, cos, sin)


def test_outputs_keep_the_projection_layout():
    q = projection_view(2, 16, 4, 64, torch.bfloat16, 11)
    k = projection_view(2, 16, 2, 64, torch.bfloat16, 12)
    cos, sin = tables(2, 16, 64, torch.bfloat16)
    q_out, k_out = ops.rotary_embedding(q, k, cos, sin)
    assert q_out.stride() == q.stride() and k_out.stride() == k.stride()


def test_autograd_matches_cpu_including_tables_and_an_unused_output():
    q_cpu = torch.randn(2, 4, 9, 16, dtype=torch.float64)
    k_cpu = torch.randn(2, 2, 9, 16, dtype=torch.float64)
    cos_cpu, sin_cpu = tables(2, 9, 16, torch.float64, repeat=False, device="cpu")

    def grads(device, use_k):
        # fresh leaves on each side (Tensor.to("cpu") of a CPU tensor would be the tensor itself)
        q, k, cos, sin = (t.to(device, copy=True).requires_grad_() for t in (q_cpu, k_cpu, cos_cpu, sin_cpu))
        q_out, k_out = ops.rotary_embedding(q, k, cos, sin)
        loss = (q_out * q_out).sum() + ((k_out * 3).sum() if use_k else 0)
        loss.backward()
        return [t.grad.cpu() if t.grad is not None else None for t in (q, k, cos, sin)]

    for use_k in (True, False):
        for g, w in zip(grads("cuda", use_k), grads("cpu", use_k)):
            if w is None:
                assert g is None or not g.any()
            else:
                torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_gradcheck_on_cuda():
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, device="cuda", requires_grad=True)
    k = torch.randn(1, 1, 3, 4, dtype=torch.float64, device="cuda", requires_grad=True)
    cos, sin = tables(1, 3, 4, torch.float64, repeat=False)
    assert torch.autograd.gradcheck(ops.rotary_embedding, (q, k, cos, sin))


def test_no_host_sync_and_cuda_graph_replay():
    q = projection_view(2, 32, 4, 64, torch.bfloat16, 13)
    k = projection_view(2, 32, 2, 64, torch.bfloat16, 14)
    cos, sin = tables(2, 32, 64, torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ops.rotary_embedding(q, k, cos, sin)
        ops.rotary_embedding_backward(q, k, cos, sin)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    static_q, static_k = q.clone(), k.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.rotary_embedding(static_q, static_k, cos, sin)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_q, out_k = ops.rotary_embedding(static_q, static_k, cos, sin)
    new_q = projection_view(2, 32, 4, 64, torch.bfloat16, 15)
    static_q.copy_(new_q)
    graph.replay()
    torch.cuda.synchronize()
    want_q, _ = ops.rotary_embedding(new_q, static_k, cos, sin)
    assert torch.equal(out_q, want_q)


def test_compile_fullgraph_matches_eager():
    import torch._dynamo

    torch._dynamo.reset()

    def step(q, k, cos, sin):
        q_out, k_out = F.apply_rotary_pos_emb(q, k, cos, sin)
        return q_out.float().square().sum() + k_out.float().sum()

    q = projection_view(2, 64, 8, 128, torch.bfloat16, 16).detach().requires_grad_()
    k = projection_view(2, 64, 2, 128, torch.bfloat16, 17).detach().requires_grad_()
    cos, sin = tables(2, 64, 128, torch.bfloat16)
    want = step(q, k, cos, sin)
    want_grads = torch.autograd.grad(want, (q, k))
    got = torch.compile(step, fullgraph=True)(q, k, cos, sin)
    got_grads = torch.autograd.grad(got, (q, k))
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads):
        assert torch.equal(g, w)


def test_errors_like_the_cpu_backend():
    q, k = torch.randn(2, 4, 5, 8, device="cuda"), torch.randn(2, 2, 5, 8, device="cuda")
    cos, sin = tables(2, 5, 8, torch.float32)
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.rotary_embedding: argument 'sin' must be on device"):
        ops.rotary_embedding(q, k, cos, sin.cpu())
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.rotary_embedding: argument 'q' must have an even head_dim"):
        ops.rotary_embedding(q[..., :7], k[..., :7], cos[..., :7], sin[..., :7])


def test_converted_llama_with_fused_rope_matches_unfused():
    transformers = pytest.importorskip("transformers")
    from cutlass_nn import fused_rotary
    import cutlass_nn

    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                   max_position_embeddings=256)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    fused = cutlass_nn.convert(model, fuse_rope=True)
    assert all(fused_rotary.is_fused(m) for m in fused.modules() if type(m).__name__ == "LlamaAttention")
    plain = copy.deepcopy(fused)
    for m in plain.modules():
        m.__dict__.pop("forward", None)
    ids = torch.randint(0, 1000, (2, 128), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    def run(m):
        m.zero_grad(set_to_none=True)
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach().float(), {n: p.grad.float() for n, p in m.named_parameters()}

    lf, gf = run(fused)
    lp, gp = run(plain)
    # the fused rotation is rounded once, the formula three times: bf16-level agreement
    torch.testing.assert_close(lf, lp, rtol=1e-2, atol=1e-2)
    for name in gp:
        rel = (gf[name] - gp[name]).norm() / gp[name].norm().clamp_min(1e-30)
        assert rel < 5e-2, name
