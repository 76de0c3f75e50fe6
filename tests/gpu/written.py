"""Checks that the tokens a kernel wrote are the reference's encoding of the same vectors, up to
what float32 against float64 may change: a code at a decision boundary, a gain by one fp16 ulp,
and, with step 4.4's scale search, the choice between near-tied scales."""

import torch

from tq_trtllm.core.quantizer import SEARCH_SCALES, search_candidates

BOUNDARY_EPS = 1e-5


def check_written(got, want, codec, x, pos, search):
    """got, want: Encoded of the vectors x [n, H, d] at packed positions pos, by a kernel and by the
    reference (with step 4.4's search or, search False, rounding y itself)."""
    # the gain depends on the codes: compare it where the group's codes agree
    same = torch.stack([(cg == cw).all(dim=-1) for cg, cw in zip(got.codes, want.codes)], dim=-1)
    ulps = (got.norms.view(torch.int16).int() - want.norms.view(torch.int16).int()).abs()
    assert ulps[same].max().item() <= 1, f"gains differ by {ulps[same].max().item()} fp16 ulps"
    ys = [y for _, y in codec.normalized_rotated(x, pos)]
    for g, (cg, cw, y) in enumerate(zip(got.codes, want.codes, ys)):
        bad = cg != cw
        frac = bad.float().mean().item()
        assert frac <= 1e-3, f"group {g}: {frac:.2%} of codes differ"
        rows = bad.any(dim=-1)
        if rows.any():
            book = codec.codebooks[g].to(y.device)
            if search:
                check_searched_codes(cg[rows].long(), y[rows], book, g)
            else:  # y itself rounded: only where it lies on a boundary
                bounds = (book[1:] + book[:-1]) / 2
                dist = (y[bad].unsqueeze(-1) - bounds).abs().min(dim=-1).values
                assert (dist < BOUNDARY_EPS).all(), f"group {g}: a code differs away from a boundary"
                assert ((cg[bad].int() - cw[bad].int()).abs() == 1).all()


def check_searched_codes(got, y, book, group):
    """Rows whose codes differ from the reference's: fp32 and float64 may pick different scales of
    step 4.4's search where two candidates' scores tie within rounding, and round differently where
    alpha * y lies on a decision boundary. So each row must be some near-best candidate's codes,
    differing from them only by one level at a boundary."""
    alphas = SEARCH_SCALES.to(y.device)
    bounds = (book[1:] + book[:-1]) / 2
    cand, score = search_candidates(y, book)
    near_best = score >= score.max(dim=-1, keepdim=True).values * (1 - 1e-5)
    off = got[:, None, :] != cand
    dist = (y[:, None, :, None] * alphas[:, None, None] - bounds).abs().min(dim=-1).values
    at_boundary = ~off | ((dist < BOUNDARY_EPS) & ((got[:, None, :] - cand).abs() == 1))
    ok = (near_best & at_boundary.all(dim=-1)).any(dim=-1)
    assert ok.all(), f"group {group}: {int((~ok).sum())} vectors' codes are no near-best candidate's"
