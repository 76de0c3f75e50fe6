"""Distortion of TurboQuant on random unit vectors: the paper's figures, measured."""

from __future__ import annotations

from ..core.spec import CodecSpec

# mse: the paper's TurboQuant-MSE (gain = norm); unbiased: the same codes with the gain the cache
# stores (docs/FORMAT.md step 4.5); prod: the paper's TurboQuant-prod (MSE + 1-bit QJL).
KINDS = ("mse", "unbiased", "prod")


def measure_distortion(bits: int, dim: int, kind: str = "mse", rotation: str = "hadamard",
                       samples: int = 100_000, seed: int = 0, batch: int = 20_000) -> dict:
    """E||x - x_hat||^2 over random unit x, and the error of <y, x_hat> - <y, x> for random unit y."""
    import torch  # here, not at import: tq-eval --help stays torch-free

    from ..core.quantizer import ProdCodec, VectorCodec

    codec = ProdCodec(dim, bits, seed=seed, rotation=rotation) if kind == "prod" else \
        VectorCodec(CodecSpec(dim, bits), seed=seed, rotation=rotation,
                    gain="norm" if kind == "mse" else "unbiased")
    gen = torch.Generator().manual_seed(seed + 1)
    sq_err = ip_sum = ip_sq = 0.0
    done = 0
    while done < samples:
        n = min(batch, samples - done)
        x = torch.randn(n, dim, generator=gen, dtype=torch.float64)
        y = torch.randn(n, dim, generator=gen, dtype=torch.float64)
        x /= x.norm(dim=-1, keepdim=True)
        y /= y.norm(dim=-1, keepdim=True)
        err = codec.roundtrip(x) - x
        ip = (err * y).sum(dim=-1)
        sq_err += (err * err).sum().item()
        ip_sum += ip.sum().item()
        ip_sq += (ip * ip).sum().item()
        done += n
    ip_mean = ip_sum / samples
    ip_var = ip_sq / samples - ip_mean**2
    return {
        "bits": bits, "dim": dim, "kind": kind, "rotation": rotation, "samples": samples,
        "seed": seed, "mse": sq_err / samples, "ip_bias": ip_mean, "ip_var": ip_var,
        "ip_bias_stderr": (ip_var / samples) ** 0.5,
    }
