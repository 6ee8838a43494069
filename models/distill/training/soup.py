"""A uniform model soup: the mean of several members' weights, all fine-tuned from one backbone.

Why: on SciFact, averaging `full` students that were trained on different draws of pseudo-queries
beat every student in the average, at no cost per query (Wortsman et al. 2022, "Model soups");
averaging one run's epochs, or branches that saw the same texts, did not
(docs/decisions.md#one-member-no-soup-by-default).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def member_seed(seed: int, member: int) -> int:
    """Member 0 trains under the run's seed itself (a one-member run is unchanged); the others under derived ones."""
    if member == 0:
        return seed
    return int(np.random.SeedSequence([seed, member]).generate_state(1)[0])


def average_states(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The elementwise mean of floating-point tensors; other tensors (ids, buffers of ints) must agree."""
    if not states:
        raise ValueError("average_states() needs at least one state")
    out: dict[str, torch.Tensor] = {}
    for name, first in states[0].items():
        if first.is_floating_point():
            out[name] = torch.stack([s[name].float() for s in states]).mean(dim=0).to(first.dtype)
        else:
            if any(not torch.equal(s[name], first) for s in states[1:]):
                raise ValueError(f"members disagree on the non-float tensor {name!r}")
            out[name] = first.clone()
    return out
