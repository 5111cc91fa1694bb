"""Several rows in one cache, each fed its own number of tokens per step: rows with holes.

A method that batches rows (SSR's main reasoning and its drafts) asks for one forward over all of
them and says afterwards how many of its fed tokens each row keeps; how that runs on the cache
(forks, per-row positions, masks over the slots a row rejected, rollbacks) is this module's job.
"""

from __future__ import annotations

import torch

from engine.runtime.cache import checkpoint, compact, crop, take_rows
from engine.runtime.model import LoadedModel


class RowBatch:
    """The rows of one batch in one shared cache. Row 0 is the row the others fork from.

    Contract:

    * :attr:`length` is the cache's one slot count, holes included: every forward appends at it.
    * A step is :meth:`forward` (each row's feed, padded to the widest) then :meth:`keep` (how
      many of its fed tokens each row keeps). The slots a row did not keep, below the longest
      kept, become its *holes*: they stay in the cache, hidden from that row by its mask.
    * :attr:`positions` ``[r]`` is row ``r``'s next position: the tokens it holds, holes excluded.
    * :attr:`valid` ``[rows, length]`` marks the slots each row sees; None while no row has a hole.
    * :meth:`fork` appends a copy of row 0; :meth:`select` keeps some rows, and a lone row left
      sheds its holes (the cache is compacted), so it goes on as a plain one-row cache.

    Holes need every slot to be one position of one row, which sliding windows and recurrent
    states are not (``CacheLayout.holes_ok``): with those, several rows must keep equal counts;
    a lone row may still keep fewer than it fed (it is rolled back: a crop, or a re-read).

    Example, a step where row 0 feeds one token and row 1 three::

        batch = RowBatch(lm, cache, length)       # one row, ``length`` slots
        batch.fork()                              # two rows, the same slots
        logits = batch.forward([[a], [b, c, d]])  # [2, 3, V]; row 0's feed is padded to [a, a, a]
        batch.keep([1, 3])                        # length + 3 slots; row 0's two padding slots are its holes
        batch.select([0])                         # row 0 alone: its holes are compacted away
    """

    def __init__(self, lm: LoadedModel, cache, length: int) -> None:
        self.lm, self.cache, self.device = lm, cache, lm.device
        self.length = length  # slots in the cache, holes included
        self.valid: torch.Tensor | None = None  # [rows, length] visible slots; None: no holes anywhere
        self.positions = [length]  # per row: tokens it holds (its next position)
        self._fed: list[list[int]] = []  # the last forward's rows, and its checkpoint (recurrent states)
        self._ckpt = None

    @property
    def rows(self) -> int:
        return len(self.positions)

    def fork(self) -> None:
        """Append a copy of row 0: its slots, its holes, its position."""
        take_rows(self.cache, [*range(self.rows), 0])
        if self.valid is not None:
            self.valid = torch.cat([self.valid, self.valid[:1]])  # [rows + 1, length]
        self.positions.append(self.positions[0])

    def forward(self, feeds: list[list[int]]) -> torch.Tensor:
        """Logits ``[rows, K, V]`` for each row's feed, padded to the longest (K). A row's padding
        sits after its real tokens, so causality already hides it in this forward; ``keep`` turns
        it into holes for the next ones."""
        assert len(feeds) == self.rows, f"{len(feeds)} feeds for {self.rows} rows"
        width = max(len(f) for f in feeds)
        self._fed = feeds
        self._ckpt = checkpoint(self.cache, self.length) if self.lm.layout.recurrent and width > 1 else None
        ids = torch.tensor([f + [f[-1]] * (width - len(f)) for f in feeds], device=self.device)  # [rows, K]
        pos = torch.tensor(self.positions, device=self.device)[:, None] + torch.arange(width, device=self.device)  # [rows, K]
        mask = None
        if self.valid is not None:
            mask = torch.cat([self.valid, torch.ones(len(feeds), width, dtype=torch.bool)], dim=1).long()  # [rows, length + K]
            mask = mask.to(self.device)
        return self.lm.forward(ids, self.cache, self.length, positions=pos, attention_mask=mask)

    def keep(self, kept: list[int]) -> None:
        """Row ``r`` keeps the first ``kept[r]`` slots it was just fed; the rest become its holes.
        Slots no row kept are rolled back off the end."""
        top = max(kept)
        if self._ckpt is not None:  # recurrent states: only a lone row feeds several tokens (no holes)
            assert len(kept) == 1, "rows with recurrent states cannot hold holes"
            self.lm.rewind(self.cache, self._ckpt, self._fed[0][:top])
        else:
            crop(self.cache, self.length + top)
        if self.valid is not None or any(k < top for k in kept):
            block = torch.arange(top)[None, :] < torch.tensor(kept)[:, None]  # [rows, top]
            valid = self.valid if self.valid is not None else torch.ones(len(kept), self.length, dtype=torch.bool)
            self.valid = torch.cat([valid, block], dim=1)  # [rows, length + top]
        self.length += top
        self.positions = [p + k for p, k in zip(self.positions, kept, strict=True)]

    def select(self, keep: list[int]) -> None:
        """Keep these rows, in this order; a lone row left sheds its holes."""
        take_rows(self.cache, keep)
        self.positions = [self.positions[i] for i in keep]
        if self.valid is not None:
            self.valid = self.valid[keep]  # [len(keep), length]
            if len(keep) == 1:
                slots = self.valid[0].nonzero().flatten()  # [positions[0]]
                compact(self.cache, slots.to(self.device))
                self.length, self.valid = len(slots), None
