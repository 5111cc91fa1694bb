"""Several rows in one cache, each fed its own number of tokens per step: rows with holes.

A method that batches rows (SSR's main reasoning and its drafts) asks for one forward over all of
them and says afterwards how many of its fed tokens each row keeps; how that runs on the cache
(forks, per-row positions, masks over the slots a row rejected, rollbacks) is this module's job.
"""

from __future__ import annotations

import torch

from engine.runtime.cache import checkpoint, compact, crop, take_rows


class RowBatch:
    """The rows of one batch in one shared cache, on a ``LoadedModel`` (``lm``, which makes them:
    ``LoadedModel.row_batch``). Row 0 is the row the others fork from.

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

    **Shared forks** (``shared=True``: the run's cache made with one row, see :func:`unshared`):
    the rows share the cache's one buffer row instead of each holding a copy of the prefix. A fork
    copies nothing (the new row sees what row 0 sees); a forward runs the rows' feeds, unpadded,
    as one packed sequence in one row (row 0's tokens, then row 1's, ...), appending one slot per
    token fed, and each token's mask shows it its row's slots; a row that leaves takes its slots
    with it (compacted away). So the cache holds the prefix once plus each row's own tokens, every
    row reads the one buffer, and no padding is computed. :attr:`valid` is then the map of which
    row sees which slot. Attention over
    the prefix and a row's own tokens is one softmax over the slots its mask shows: the merge is
    exact by construction. A lone row left holds exactly its own slots, in position order: the
    cache plain decoding holds.

    Longrope (``engine.runtime.rope``): the forward where row 0 first passes the switch point
    re-encodes every row's whole history with its feed, from an empty cache, as plain decoding
    re-encodes its one sequence there; before it, :meth:`limits` says how far each row may be fed
    without any position reaching the switch (which would switch every row to the long factors).
    That needs the rows' tokens: pass ``ids``, the tokens the cache holds.

    Example, a step where row 0 feeds one token and row 1 three::

        batch = RowBatch(lm, cache, len(ids), ids)  # one row holding ``ids``
        batch.fork()                              # two rows, the same slots
        logits = batch.forward([[a], [b, c, d]])  # [2, 3, V]; row 0's feed is padded to [a, a, a]
        batch.keep([1, 3])                        # length + 3 slots; row 0's two padding slots are its holes
        batch.select([0])                         # row 0 alone: its holes are compacted away
    """

    def __init__(self, lm, cache, length: int, ids: list[int] | None = None, shared: bool = False) -> None:
        self.lm, self.cache, self.device = lm, cache, lm.device
        self.shared = shared  # rows share one buffer row (the class docstring's shared forks)
        self.length = length  # slots in the cache, holes included
        self.valid: torch.Tensor | None = None  # [rows, length] visible slots; None: no holes anywhere
        self.positions = [length]  # per row: tokens it holds (its next position)
        # per row: the tokens it holds, holes excluded (None: not tracked; only a re-encode needs them)
        assert ids is None or len(ids) == length, f"{len(ids)} ids for a cache of {length} slots"
        self.ids = None if ids is None else [list(ids)]
        self.last_tokens = 0  # tokens the last forward computed: padding and any re-encode included
        self._fed: list[list[int]] = []  # the last forward's rows, and its checkpoint (recurrent states)
        self._ckpt = None

    @property
    def rows(self) -> int:
        return len(self.positions)

    def fork(self) -> None:
        """Append a copy of row 0: its slots, its holes, its position (shared: a view of them)."""
        if self.shared:
            self.valid = self._visible()
        else:
            take_rows(self.cache, [*range(self.rows), 0])
        if self.valid is not None:
            self.valid = torch.cat([self.valid, self.valid[:1]])  # [rows + 1, length]
        self.positions.append(self.positions[0])
        if self.ids is not None:
            self.ids.append(list(self.ids[0]))

    def limits(self, owed: int) -> list[int] | None:
        """The most tokens each row may be fed this step, row 0 owing ``owed`` tokens first (None:
        any number; see ``Rope.limits``)."""
        return self.lm.rope.limits(self.positions, owed)

    def forward(self, feeds: list[list[int]]) -> torch.Tensor:
        """Logits ``[rows, K, V]`` for each row's feed, padded to the longest (K). A row's padding
        sits after its real tokens at its last token's position (so it never reaches a position
        the row's feed does not), causality hides it in this forward, and ``keep`` turns it into
        holes for the next ones."""
        assert len(feeds) == self.rows, f"{len(feeds)} feeds for {self.rows} rows"
        width = max(len(f) for f in feeds)
        self._fed = feeds
        if self.lm.rope.crosses(self.positions[0], self.positions[0] + len(feeds[0])):
            return self._reencode(feeds, width)
        if self.shared and self.rows > 1:
            return self._packed_forward(feeds, width)
        self._ckpt = checkpoint(self.cache, self.length) if self.lm.layout.recurrent and width > 1 else None
        mask = None
        if self.valid is not None:
            mask = torch.cat([self.valid, torch.ones(len(feeds), width, dtype=torch.bool)], dim=1).long()  # [rows, length + K]
            mask = mask.to(self.device)
        self.last_tokens = self.rows * width
        return self.lm.forward(_padded(feeds, width, self.device), self.cache, self.length,
                               positions=_feed_positions(self.positions, feeds, width, self.device), attention_mask=mask)

    def _packed_forward(self, feeds: list[list[int]], width: int) -> torch.Tensor:
        """Shared forks: every row's feed, unpadded, as one packed sequence of ``sum(len(feed))``
        tokens in one row (row 0's, then row 1's, ...), each at its row's positions, taking as many
        new slots. A 4-D mask ``[1, 1, tokens, length + tokens]`` (additive, as every attention
        function takes) shows each token the slots :attr:`valid` gives its row, then its own row's
        new tokens causally. Nothing is computed for padding: a step in which row 0 verifies eight
        lookup tokens beside a draft writing one computes nine tokens, not sixteen. Logits come back
        as ``[rows, width, V]``, a row's padding given its last token's logits (as a padded row's
        padding would be read: never, past what the row was fed)."""
        lens = [len(f) for f in feeds]
        starts = [sum(lens[:r]) for r in range(len(lens))]
        total = sum(lens)
        self._make_room(total)
        seen = torch.zeros(total, self.length + total, dtype=torch.bool)
        visible = self._visible()
        for r, (s, n) in enumerate(zip(starts, lens, strict=True)):
            seen[s : s + n, : self.length] = visible[r]
            seen[s : s + n, self.length + s : self.length + s + n] = torch.ones(n, n, dtype=torch.bool).tril()
        dtype = self.lm.model.dtype
        mask = torch.zeros(seen.shape, dtype=dtype).masked_fill_(~seen, torch.finfo(dtype).min)[None, None]
        ids = torch.tensor([[t for f in feeds for t in f]], device=self.device)
        pos = torch.tensor([[p + j for p, n in zip(self.positions, lens, strict=True) for j in range(n)]], device=self.device)
        self.last_tokens = total
        logits = self.lm.forward(ids, self.cache, self.length, positions=pos, attention_mask=mask.to(self.device))[0]
        index = torch.tensor([[s + min(j, n - 1) for j in range(width)] for s, n in zip(starts, lens, strict=True)])
        return logits[index.to(logits.device)]  # [rows, width, V]

    def _visible(self) -> torch.Tensor:
        """:attr:`valid`, or every slot visible to every row where no row has a hole."""
        return self.valid if self.valid is not None else torch.ones(self.rows, self.length, dtype=torch.bool)

    def _make_room(self, slots: int) -> None:
        """Shared forks: before a forward that appends ``slots`` beyond the cache's capacity, the
        slots no row sees any more (rejected, padding) are compacted away; if that is not room
        enough (more drafts live at once than the cache was sized for), every layer grows by an
        eighth, or what the forward needs, copying the used slots once."""
        capacity = min((layer.capacity for layer in self.cache.slot_layers), default=None)  # a grown layer's too
        if capacity is None or self.length + slots <= capacity:
            return
        if self.valid is not None:
            self._compact(self.valid.any(0))
        if self.length + slots > capacity:
            for layer in self.cache.slot_layers:
                layer.reserve(max(self.length + slots, capacity + capacity // 8))

    def _compact(self, live: torch.Tensor) -> None:
        """Keep only the slots ``live`` (``[length]`` bool), in order (the cache's one buffer row)."""
        if bool(live.all()):
            return
        slots = live.nonzero().flatten()
        compact(self.cache, slots.to(self.device))
        self.length, self.valid = len(slots), self.valid[:, live]

    def _reencode(self, feeds: list[list[int]], width: int) -> torch.Tensor:
        """Row 0's first forward past longrope's switch point: every row's history, then its feed,
        in one forward from an empty cache, so every key is encoded with the long factors from here
        on, as plain decoding's re-encode of its one sequence does. A row shorter than the longest
        history gets holes after its own tokens (only rows of a cache that holds holes differ in
        length: the others are fed one token per row per step)."""
        assert self.ids is not None, "re-encoding at longrope's switch point needs the rows' tokens (RowBatch ids)"
        assert not self.lm.layout.recurrent, "a recurrent state cannot be re-encoded by a crop"
        hist = max(len(h) for h in self.ids)
        crop(self.cache, 0)
        self._ckpt = None
        self.length, self.positions = hist, [len(h) for h in self.ids]
        block = torch.arange(hist)[None, :] < torch.tensor(self.positions)[:, None]  # [rows, hist]: each row's tokens
        self.valid = None if bool(block.all()) else block
        history = _padded(self.ids, hist, self.device)  # [rows, hist]
        ids = torch.cat([history, _padded(feeds, width, self.device)], dim=1)  # [rows, hist + K]
        pos = torch.cat([_feed_positions([0] * self.rows, self.ids, hist, self.device),
                         _feed_positions(self.positions, feeds, width, self.device)], dim=1)  # [rows, hist + K]
        mask = None if self.valid is None else \
            torch.cat([block, torch.ones(self.rows, width, dtype=torch.bool)], dim=1).long().to(self.device)
        self.last_tokens = self.rows * (hist + width)
        return self.lm.forward(ids, self.cache, 0, positions=pos, attention_mask=mask)[:, hist:]

    def keep(self, kept: list[int]) -> None:
        """Row ``r`` keeps the first ``kept[r]`` slots it was just fed; the rest become its holes.
        Slots no row kept are rolled back off the end."""
        if self.shared and self.rows > 1:
            top = self._keep_shared(kept)
        else:
            top = max(kept)
            if self._ckpt is not None:  # recurrent states: only a lone row feeds several tokens (no holes)
                assert len(kept) == 1, "rows with recurrent states cannot hold holes"
                self.lm.rewind(self.cache, self._ckpt, self._fed[0][:top])
            else:
                crop(self.cache, self.length + top)
            if self.valid is not None or any(k < top for k in kept):
                block = torch.arange(top)[None, :] < torch.tensor(kept)[:, None]  # [rows, top]
                self.valid = torch.cat([self._visible(), block], dim=1)  # [rows, length + top]
        self.length += top
        self.positions = [p + k for p, k in zip(self.positions, kept, strict=True)]
        if self.ids is not None:
            for row, fed, k in zip(self.ids, self._fed, kept, strict=True):
                row.extend(fed[:k])

    def _keep_shared(self, kept: list[int]) -> int:
        """Shared forks: row ``r`` keeps the first ``kept[r]`` of the new slots its feed took (packed,
        row after row), seen by it alone; the slots past the last one kept are rolled back off the end. The slots added."""
        lens = [len(f) for f in self._fed]
        new = torch.zeros(self.rows, sum(lens), dtype=torch.bool)  # [rows, slots added]: the packed feeds'
        for r, k in enumerate(kept):
            new[r, sum(lens[:r]) : sum(lens[:r]) + k] = True
        used = new.any(0).nonzero()
        top = int(used.max()) + 1 if len(used) else 0
        crop(self.cache, self.length + top)
        self.valid = torch.cat([self._visible(), new[:, :top]], dim=1)  # [rows, length + top]
        return top

    def select(self, keep: list[int]) -> None:
        """Keep these rows, in this order; a lone row left sheds its holes (shared: the slots no
        row left sees go, so a row that leaves takes its own slots with it)."""
        if not self.shared:
            take_rows(self.cache, keep)
        self.positions = [self.positions[i] for i in keep]
        if self.ids is not None:
            self.ids = [self.ids[i] for i in keep]
        if self.valid is not None:
            self.valid = self.valid[keep]  # [len(keep), length]
            if self.shared or len(keep) == 1:  # the slots no row left sees go (copies: only a lone row's holes)
                self._compact(self.valid.any(0))
            if len(keep) == 1:
                self.valid = None  # a lone row sees every slot left


MASKED_ATTENTION = ("sdpa", "eager")  # attention functions that take a 4-D mask as it is (shared forks need one)


def unshared(lm) -> str | None:
    """Why this run's rows cannot share the prefix (:class:`RowBatch`'s shared forks) on ``lm``, in
    words; None where they can. Shared forks need a slot to be one position of one row, masks that
    hide slots (the capability probe's holes and shared-forks checks), k-token forwards, eager steps
    on a cache of slots, and an attention function that takes the 4-D mask as given; and unless an
    operator asked for them (``share_forks``), a riding step no dearer shared than copied (the probe
    times both: on a small model the shared path's mask and slot map can cost more than the copies)."""
    impl = getattr(lm.model.config, "_attn_implementation", None)
    reasons = (
        (lm.share_forks is False, "shared forks turned off (LoadedModel.share_forks)"),
        (lm.layout.sliding or _windowed(lm.model.config), "its sliding-window layers window slots, not one row's positions"),
        (lm.layout.recurrent, "its recurrent states are one per row"),
        (lm.capabilities.holes_unsafe, "its mask does not hide slots (the capability probe's holes check)"),
        (lm.capabilities.shared_unsafe, "rows sharing the cache did not decode as copies do (the capability probe's shared-forks check)"),
        (lm.share_forks is None and lm.capabilities.copies_cheaper, lm.capabilities.copies_cheaper),
        (lm.capabilities.one_token_steps, "its multi-token forwards run one token at a time"),
        (lm.exact == "fixed", "exact mode's fixed route keeps a slot range per row"),
        (lm.compiled is not None, "compiled steps keep a slot range per row"),
        (lm.rope.reprefills, "longrope re-encodes every row at its switch point"),
        (impl not in MASKED_ATTENTION and lm.exact != "rows", f"its attention ({impl}) takes no 4-D mask as given"),
    )
    return next((why for cond, why in reasons if cond), None)


def rotary(config) -> bool:
    """Whether the model places positions by rotary embeddings computed from the positions passed
    (its ``rope_parameters``), so the number of slots a cache holds is bounded by nothing but memory.
    Models with learned absolute positions (GPT-2, GPT-Neo) may keep buffers of their positions' size
    that a forward indexes by slot: a shared cache stays within their positions."""
    return bool(getattr(config.get_text_config(decoder=True), "rope_parameters", None))


def _windowed(config) -> bool:
    """A window declared under another name than transformers' ``sliding_window`` (GPT-Neo's local
    layers: ``window_size``, applied by slot index), which the cache layout does not see."""
    config = config.get_text_config(decoder=True)
    return bool(getattr(config, "window_size", None)) or "local" in (getattr(config, "attention_layers", None) or ())


def _padded(rows: list[list[int]], width: int, device) -> torch.Tensor:
    """``[len(rows), width]`` token ids, each row padded with its last token."""
    return torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], device=device)


def _feed_positions(starts: list[int], rows: list[list[int]], width: int, device) -> torch.Tensor:
    """``[len(rows), width]`` positions: row ``r``'s tokens from ``starts[r]`` on, its padding at
    its last token's position (a cache is passed, so transformers reads no packed sequences
    into positions that stop growing)."""
    steps = torch.tensor([[min(j, len(r) - 1) for j in range(width)] for r in rows])  # [rows, width]
    return (torch.tensor(starts)[:, None] + steps).to(device)
