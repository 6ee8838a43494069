"""models.encoders.pooling: each pooling mode on a small tensor, right and left padded, against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from models.encoders.pooling import exclude_prompt, pool

# two rows of four 2-d token states: row 0 right-padded (3 real tokens), row 1 left-padded (3 real tokens)
HIDDEN = torch.tensor([[[1.0, 2.0], [3.0, 0.0], [5.0, 4.0], [100.0, 100.0]],
                       [[100.0, 100.0], [2.0, 6.0], [0.0, 2.0], [4.0, 1.0]]])
MASK = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
EXPECTED = {
    "mean": [[3.0, 2.0], [2.0, 3.0]],
    "mean_sqrt_len_tokens": [[9 / math.sqrt(3), 6 / math.sqrt(3)], [6 / math.sqrt(3), 9 / math.sqrt(3)]],
    "max": [[5.0, 4.0], [4.0, 6.0]],
    "cls": [[1.0, 2.0], [2.0, 6.0]],
    "lasttoken": [[5.0, 4.0], [4.0, 1.0]],
    # weights 1, 2, 3 from each row's first real token
    "weightedmean": [[(1 + 6 + 15) / 6, (2 + 0 + 12) / 6], [(2 + 0 + 12) / 6, (6 + 4 + 3) / 6]],
}


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_each_mode_matches_the_hand_computation(mode: str) -> None:
    torch.testing.assert_close(pool(HIDDEN, MASK, mode), torch.tensor(EXPECTED[mode]))  # type: ignore[arg-type]


def test_an_excluded_prompt_leaves_the_tokens_after_it() -> None:
    kept = exclude_prompt(MASK, 1)
    assert kept.tolist() == [[0, 1, 1, 0], [0, 0, 1, 1]]
    torch.testing.assert_close(pool(HIDDEN, kept, "mean"), torch.tensor([[4.0, 2.0], [2.0, 1.5]]))
    torch.testing.assert_close(pool(HIDDEN, kept, "cls"), torch.tensor([[3.0, 0.0], [0.0, 2.0]]))
    # weightedmean still counts positions from the first real token of the full mask: weights 2, 3
    torch.testing.assert_close(pool(HIDDEN, kept, "weightedmean", full_mask=MASK),
                               torch.tensor([[(6 + 15) / 5, 12 / 5], [12 / 5, (4 + 3) / 5]]))


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pooling mode 'sum'"):
        pool(HIDDEN, MASK, "sum")  # type: ignore[arg-type]
