"""How much each layer's K or V quantization at each width costs, measured on the model.

The expected KL divergence between the model's next-token distributions with and without a small
perturbation delta of one layer's keys (or values) is 1/2 delta^T F delta, F the Fisher information of
the output distribution with respect to them. With labels y drawn from the model's own distribution,
F = E_y[g_y g_y^T], g_y the gradient of log p(y), so 1/2 E_y[(g_y . delta)^2] estimates it from a few
backward passes. delta is the actual quantization error of the layer's codec at each width, so one
forward pass and a few backward passes price every (layer, K/V, width) at once.

Quantization errors of different tokens and heads are independent and nearly zero-mean, so the
cross terms of (g . delta)^2 between vectors vanish in expectation; summing the per-vector terms
(g_t . delta_t)^2 keeps the expectation and removes most of the variance of one squared sum.

A query reads its `recent` most recent positions (its own included) as computed, never through the
cache, so a token's quantization error reaches only the queries farther away. The gradients are
taken under that rule: the near queries read a detached copy of the keys and values, and g_t sums
the far queries' share alone. (Without it, a layer whose heads look at the previous token is priced
as if the cache served that token, and the allocator spends bits where the window already helps.)
"""

from __future__ import annotations

import torch

from .capture import run_observed


def fisher_gradients(model, windows: torch.Tensor, samples: int, seed: int, recent: int):
    """Per layer: (k, v, grads_k, grads_v), grads a list over label samples; tensors [B, H, T, d].
    Each query reads its `recent` most recent positions exactly, so they add nothing to the grads.

    The gradients are taken with respect to the keys and values alone (torch.autograd.grad): the
    backward passes skip the weights' gradients, which the estimate never reads and which were
    half of their work."""
    captured = {}

    def keep(layer, query, key, value):
        key.tq_exact = (key.detach(), value.detach(), recent)
        captured[layer] = (key, value)

    logits = run_observed(model, windows, keep, grad=True)
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    gen = torch.Generator().manual_seed(seed)
    layers = sorted(captured)
    inputs = [t for layer in layers for t in captured[layer]]
    grads = {layer: ([], []) for layer in layers}
    for i in range(samples):
        labels = torch.multinomial(log_probs.detach().exp().view(-1, log_probs.shape[-1]), 1,
                                   generator=gen).view(log_probs.shape[:-1])
        found = torch.autograd.grad(log_probs.gather(-1, labels[..., None]).sum(), inputs,
                                    retain_graph=i + 1 < samples)
        for j, layer in enumerate(layers):
            grads[layer][0].append(found[2 * j])
            grads[layer][1].append(found[2 * j + 1])
    return {layer: (key.detach(), value.detach(), *grads[layer]) for layer, (key, value) in captured.items()}


def fisher_terms(x: torch.Tensor, grads: list[torch.Tensor], codec, exact_tokens: int) -> torch.Tensor:
    """1/2 sum over vectors of (g_y . delta)^2 for each window b and label sample y, float64
    [B, samples]; delta = the codec's roundtrip error of x [B, H, T, d], position t packed position
    t - exact_tokens. Its mean over the samples, summed over the windows, is fisher_cost."""
    packed = torch.arange(x.shape[2], device=x.device) - exact_tokens
    delta = codec.roundtrip(x.double().transpose(1, 2), packed).transpose(1, 2) - x.double()
    delta[:, :, :exact_tokens] = 0.0
    return 0.5 * torch.stack([((g.double() * delta).sum(dim=-1) ** 2).sum(dim=(1, 2)) for g in grads],
                             dim=1)


def fisher_cost(x: torch.Tensor, grads: list[torch.Tensor], codec, exact_tokens: int) -> float:
    """1/2 E_y[sum over vectors of (g_y . delta)^2], summed over the batch (fisher_terms)."""
    return fisher_terms(x, grads, codec, exact_tokens).mean(dim=1).sum().item()
