import torch, sys
from metakernel.catalog import load_catalog
from metakernel.expected import compute_expected
from metakernel.compare import compare
dev = sys.argv[1]; scale = sys.argv[2]
p = load_catalog().problem(56)
torch.manual_seed(1)
inp = p.make_inputs(dev, scale)
e = compute_expected(p, inp)
v = compare(e.returned, {}, e)
print(v.text())
sn, sa = e.reference["kv_c_scale"], e.anchor["kv_c_scale"]
print("scale rel diff max", ((sn.double()-sa)/sa).abs().max().item())
x_q = inp[0]
print("fp8->f64 ok:", torch.equal(x_q.double().float(), x_q.float()))
m = p.module
cdt, acc = torch.bfloat16, torch.float32
x = m._dequant_act(inp[0], inp[1], acc); w = m._dequant_weight(inp[2], inp[3], acc)
h32 = x @ w.t()
x64 = m._dequant_act(inp[0], inp[1], torch.float64); w64 = m._dequant_weight(inp[2], inp[3], torch.float64)
h64 = x64 @ w64.t()
print("h rel err", ((h32.double()-h64).abs().max()/h64.abs().max()).item(), "tf32", torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
print("x dequant equal", torch.equal(x.double(), x64), "w equal", torch.equal(w.double(), w64))
