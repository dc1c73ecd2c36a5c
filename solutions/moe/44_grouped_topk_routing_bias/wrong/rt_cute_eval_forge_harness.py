"""Harness forgery: eager PyTorch does all the routing and the child's own bookkeeping is rewritten to call it CuTe.

No CuTe kernel ever runs. Code evaluated through functools.singledispatch (compiled as "<string>", so none of it
is attributed to this file by the audit hook, and none of it is visible to the static rules) reaches the
grading child's module as `sys.modules["__main__"]` and the CuTe launch gate in `metakernel.dsl.cute`, then:
- every call adds one launch to the gate, and answers garbage whenever the gate is not in plain "run" mode or is
  auditing/randomising (the ablations then "break" the outputs, the audit sees no argument at all);
- the randomising ablation is told one argument was randomised, so it is not dismissed as inconclusive;
- `Child.profile` (a class attribute: rebinding it raises no audit event) is wrapped so that its reply lists every
  profiled kernel name as a compiled CuTe symbol: DSL share 100 %, nothing foreign.
Reassigning module, class and instance attributes raises no audit event; the verdict has to come from somewhere
the candidate cannot write. What refuses it: the audit hook, which lets a string be compiled after the kernel's
import only when it is a type expression (or the import system's, the DSL parsers' or the standard library's own
generated code) — this file's evaluated statements are refused when typing resolves the annotation.

Category: gate_forgery
Expected: rule_violation/sandbox
"""

import functools

import torch
import cutlass  # noqa: F401  (nothing is compiled)

NUM_EXPERTS = 256
N_GROUP = 8
TOPK_GROUP = 4
TOP_K = 8
SCALE = 2.5

_BOX = {}


def _evaluate(source):
    """Evaluate the expression `source` with this module's globals, without eval in this file.

    functools.singledispatch's register() reads the function's annotation and, when it is a string, resolves it with
    typing.get_type_hints, which evaluates it. The annotation below is a variable, so the static rules (which parse
    only string constants written as annotations) never see the text; the code it runs is compiled as "<string>".
    """
    dispatcher = functools.singledispatch(lambda value: value)

    def probe(value: source):
        return value

    dispatcher.register(probe)


def _define(code):
    """Run statements `code` in this module's globals; what they put into _BOX is how they talk back."""
    _BOX["code"] = code
    _evaluate("exec(_BOX['code'], globals()) or int")
FORGE = '''
import sys

def install():
    gate_module = sys.modules.get("metakernel.dsl.cute")
    state = getattr(gate_module, "_STATE", None)
    main = sys.modules.get("__main__")
    child_cls = getattr(main, "Child", None)
    if child_cls is not None and hasattr(child_cls, "profile") and not hasattr(child_cls, "rt_forged"):
        original = child_cls.profile

        def profile(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            reply = result[0] if isinstance(result, tuple) else result
            names = set(reply.get("kernel_names") or [])
            names.update(name for name, _ in reply.get("kernels") or [])
            reply["kernel_names"] = sorted(names)
            return result

        child_cls.profile = profile
        child_cls.rt_forged = True

    def gate_says_run():
        gate = state.gate if state is not None else None
        if gate is None:
            return True
        gate.launches += 1
        honest = gate.mode == "run" and not getattr(gate, "audit", False) and not getattr(gate, "randomize", False)
        if getattr(gate, "randomize", False):
            gate.randomized += 1
        return honest

    return gate_says_run

_BOX["gate_says_run"] = install()
'''


def _route(logits, bias):
    t, e = logits.shape
    scores = torch.sigmoid(logits.float())
    choice = scores + bias.float()[None, :]
    group = choice.view(t, N_GROUP, e // N_GROUP).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group, dtype=torch.bool).scatter_(1, group.topk(TOPK_GROUP, dim=-1).indices, True)
    masked = choice.masked_fill(~keep[:, :, None].expand(t, N_GROUP, e // N_GROUP).reshape(t, e), 0.0)
    ids = masked.topk(TOP_K, dim=-1).indices
    w = scores.gather(1, ids)
    return w / w.sum(-1, keepdim=True) * SCALE, ids.to(torch.int32)


def solve(gating_output, e_score_correction_bias):
    if "gate_says_run" not in _BOX:
        _define(FORGE)
    weights, ids = _route(gating_output, e_score_correction_bias)
    if not _BOX["gate_says_run"]():
        return torch.zeros_like(weights), torch.zeros_like(ids)
    return weights, ids
