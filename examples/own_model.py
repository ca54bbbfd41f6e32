"""Your own PyTorch model through vpp (pre-norm blocks, RoPE, gated MLP), checked against its unpipelined
forward: python examples/own_model.py (2 spawned CPU ranks), or torchrun --nproc-per-node 2 examples/own_model.py"""
import torch
import torch.nn.functional as F
from torch import nn

from vpp.parallel import initialize_model_parallel, launch
from vpp.runtime import Pipeline, forward_cpp_prefill, forward_vpp_prefill, make_layout
from vpp.runtime.layer_stages import KVCache, stages_from_module


def rope(x, positions, theta=10000.0):  # x [heads, c, head_dim]
    angles = positions[:, None].float() * theta ** (-torch.arange(x.shape[-1] // 2) / (x.shape[-1] // 2))
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x1 * angles.sin() + x2 * angles.cos()], -1)


class Block(nn.Module):
    def __init__(self, d=64, heads=4, ff=128):
        super().__init__()
        self.heads, self.norm1, self.norm2 = heads, nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate_up, self.down = nn.Linear(d, 2 * ff, bias=False), nn.Linear(ff, d, bias=False)

    def forward(self, h, positions, kv):  # h [c, d]; kv: this block's cache of the request
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(0, 1) for t in self.qkv(self.norm1(h)).chunk(3, -1))
        k, v = kv.update(rope(k, positions), v)  # every token so far: [heads, tokens, head_dim]
        causal = positions[:, None] >= torch.arange(k.shape[1])[None, :]
        a = F.scaled_dot_product_attention(rope(q, positions), k, v, attn_mask=causal)
        h = h + self.out(a.transpose(0, 1).flatten(1))
        gate, up = self.gate_up(self.norm2(h)).chunk(2, -1)
        return h + self.down(F.silu(gate) * up)


class MyModel(nn.Module):
    def __init__(self, vocab=256, d=64, blocks=4):
        super().__init__()
        self.embed, self.norm, self.head = nn.Embedding(vocab, d), nn.RMSNorm(d), nn.Linear(d, vocab, bias=False)
        self.layers = nn.ModuleList(Block(d) for _ in range(blocks))

    @torch.no_grad()
    def forward(self, ids):  # unpipelined, the whole prompt at once: the reference
        h, cache = self.embed(ids), KVCache(len(self.layers))
        for i, block in enumerate(self.layers):
            h = block(h, torch.arange(len(ids)), cache.layer(0, i))
        return self.head(self.norm(h))


def run(rank, world):
    groups = initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=world)
    torch.manual_seed(0)
    model, ids = MyModel().eval(), torch.randint(0, 256, (300,))  # the same weights and prompt on every rank
    for name, kind, prefill, kw in (("vpp-async", "v", forward_vpp_prefill, {"async_comm": True}),
                                    ("cpp", "loop", forward_cpp_prefill, {})):
        stages = stages_from_module(model, make_layout(kind, 4, world), groups.pp.rank)
        mine = ids if any(s.is_first for s in stages) else None
        out = prefill(stages, mine, 64, groups, **kw)
        if out.logits is not None:  # on the rank holding the last stage
            print(f"{name}: max |logits - unpipelined| {float((out.logits - model(ids)[-1]).abs().max()):.1e}")
    pipe, new = Pipeline(stages, groups), ids.tolist()
    pipe.release(0)  # the CPP prefill's caches (request ids count from 0)
    tokens = pipe.generate(mine, max_new_tokens=4, chunk_size=64, schedule="cpp").tokens[0]
    for _ in range(4):
        new.append(int(model(torch.tensor(new))[-1].argmax()))
    if groups.global_rank == 0:
        print(f"Pipeline tokens {tokens}, unpipelined {new[-4:]}")


if __name__ == "__main__":
    launch(run, 2)
