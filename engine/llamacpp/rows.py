"""SSR's rows on llama.cpp: one sequence per row in one context (``engine.runtime.batch.RowBatch``'s
contract: ``fork``, ``limits``, ``forward``, ``keep``, ``select``, ``rows``, ``positions``,
``last_tokens``).

A context's KV cache is unified: a fork (``seq_cp``) adds the new sequence's id to the main row's
cells, so the prefix is held once whatever the number of drafts; a forward is one batch of every
row's feed, unpadded, each token at its own sequence's next positions; a row that keeps fewer
tokens than it was fed has the rest removed (``seq_rm`` from its first rejected position).

**The main row's cells stay in position order**, which its exactness needs: llama.cpp's attention
visits a token's cells in cell order, so a token whose earlier positions sit in a different order
of cells than plain decoding's sums them in another order (measured: logits off by up to 1.2 once
the main row's tokens filled cells a departed draft had freed). llama.cpp puts a batch's tokens in
the first free cells, in batch order, so the main row, first in every batch, only ever takes free
cells after its own, as long as no cell before its last is freed. A rejected token's cell is
always after the main row's (it came in the last batch, behind the main row's tokens), so a
rollback keeps the order; a row that leaves would not, so its cells are not freed but **parked**:
moved to sequence :data:`PARK`, which no row reads, until the run's context is cleared.
"""

from __future__ import annotations

import torch

from engine.llamacpp.lib import Item


class SeqRows:
    def __init__(self, cache, length: int) -> None:
        self.cache, self.ctx = cache, cache.ctx
        self.seqs = [0]  # row r's sequence id; row 0 (the main row) is sequence 0
        self.positions = [length]  # per row: the tokens its sequence holds (its next position)
        self.last_tokens = 0  # tokens the last forward computed (no padding here)
        self._fed: list[int] = []  # the last forward's feed lengths

    @property
    def rows(self) -> int:
        return len(self.seqs)

    @property
    def park(self) -> int:
        """The sequence that holds departed rows' cells: the context's last (no row is given it)."""
        return self.ctx.seqs - 1

    def fork(self) -> None:
        """A new row holding what row 0 holds (sharing its cells)."""
        free = sorted(set(range(self.park)) - set(self.seqs))
        if not free:
            raise ValueError(f"a llama.cpp context of {self.ctx.seqs} sequences holds no more rows")
        seq = free[0]
        self.ctx.seq_cp(self.seqs[0], seq)  # its id is free: a departed row's cells were moved off it
        self.seqs.append(seq)
        self.positions.append(self.positions[0])

    def limits(self, owed: int) -> list[int] | None:
        """Any number of tokens: llama.cpp applies the file's RoPE per position, the same in every batch."""
        return None

    def forward(self, feeds: list[list[int]]) -> torch.Tensor:
        """Logits ``[rows, K, V]`` for each row's feed (K the longest; a shorter row's last logits
        repeat past its feed, never read): one batch, every token at its row's positions."""
        assert len(feeds) == self.rows, f"{len(feeds)} feeds for {self.rows} rows"
        items = [Item(t, p + j, seq) for feed, p, seq in zip(feeds, self.positions, self.seqs, strict=True)
                 for j, t in enumerate(feed)]
        logits = torch.from_numpy(self.ctx.decode(items))  # [sum of feeds, V]
        lens = [len(f) for f in feeds]
        self._fed, self.last_tokens = lens, len(items)
        width, starts = max(lens), [sum(lens[:r]) for r in range(len(lens))]
        index = torch.tensor([[s + min(j, n - 1) for j in range(width)] for s, n in zip(starts, lens, strict=True)])
        return logits[index]

    def keep(self, kept: list[int]) -> None:
        """Row ``r`` keeps the first ``kept[r]`` tokens it was just fed; its sequence loses the rest."""
        for r, (seq, fed, k) in enumerate(zip(self.seqs, self._fed, kept, strict=True)):
            if k < fed:
                self.ctx.seq_rm(seq, self.positions[r] + k)
            self.positions[r] += k
        self.cache.fed = self.positions[0]

    def select(self, keep: list[int]) -> None:
        """Keep these rows, in this order (row 0 stays first); the others' cells are parked (the
        module's docstring: freed, the main row would fill them out of order)."""
        assert keep and keep[0] == 0, "the main row stays row 0"
        for r, seq in enumerate(self.seqs):
            if r not in keep:
                self.ctx.seq_cp(seq, self.park)
                self.ctx.seq_rm(seq)
        self.seqs = [self.seqs[r] for r in keep]
        self.positions = [self.positions[r] for r in keep]
