"""Continuous batching for the transformers server (`gymforge.llm.serving`): concurrent requests decoded together.

`BatchDecoder.run(row)` queues one request (a `Row`: its prompt ids and its own sampling parameters) and returns
when it is finished. One worker thread decodes every queued row together, one token a step: rows that arrive join
the running batch between steps (their prompts prefilled left-padded, their KV cache merged into the batch's), rows
that finish leave it and are answered at once. Each row samples under its own temperature, top-k and top-p and its
own `torch.Generator` (seeded by the request, else at random), so a seeded request's reply does not depend on what
else is in the batch, up to floating-point rounding; greedy rows take the argmax.

transformers' own continuous batching (`generate_batch`) is not used: it draws every request's tokens from one
generator, chooses greedy or sampling for the whole batch and has no stop strings.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("gymforge.llm.serving")


@dataclass(eq=False)
class Row:
    """One request in the decoding batch: its prompt, its own sampling parameters, and what it has produced."""

    ids: list[int]
    limit: int  # new tokens at most
    temperature: float  # <= 0: greedy
    top_p: float
    top_k: int  # 0: no top-k
    stops: list[str]
    seed: int | None
    generator: Any = None  # a torch.Generator of the row's own (sampled rows)
    new: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class BatchDecoder:
    """Decodes queued `Row`s together on one worker thread (`max_batch` rows at most)."""

    def __init__(self, model: Any, *, device: str, pad_id: int, eos_ids: list[int], max_batch: int,
                 decode: Callable[[list[int]], str], prefill_tokens: int = 8192) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self.model, self.device, self.pad_id, self.eos_ids = model, device, pad_id, eos_ids
        self.max_batch = max_batch
        self.decode = decode  # token ids -> text, for stop strings
        self.prefill_tokens = prefill_tokens  # padded prompt tokens prefilled in one forward pass at most
        self._pending: list[Row] = []
        self._wake = threading.Condition()
        self._worker: threading.Thread | None = None
        self._can_join: bool | None = None  # whether rows may join a running batch (known after the first prefill)

    def run(self, row: Row) -> Row:
        """Queue `row`, wait until it is finished (its `new` tokens and `logprobs` filled in), and return it."""
        with self._wake:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._decode_loop, name="gymforge-batcher", daemon=True)
                self._worker.start()
            self._pending.append(row)
            self._wake.notify()
        row.done.wait()
        if row.error is not None:
            raise row.error
        return row

    def _decode_loop(self) -> None:
        """Decode the waiting requests together, one token a step for every row; requests that arrive join the
        batch between steps (up to `max_batch` rows), rows that finish leave it and are answered at once."""
        import torch

        rows: list[Row] = []
        batch: tuple[Any, Any] | None = None  # (KV cache, attention mask [rows, positions]) of `rows`
        logits = None  # [rows, vocab]: each row's next-token scores
        while True:
            with self._wake:
                while not rows and not self._pending:
                    self._wake.wait()
                joining: list[Row] = []
                if not rows or self._can_join:
                    joining = self._pending[: self.max_batch - len(rows)]
                    del self._pending[: len(joining)]
            try:
                with torch.inference_mode():
                    for group in self._prefill_groups(joining):
                        if rows and not self._can_join:  # the first group's cache cannot be merged into
                            with self._wake:
                                self._pending[:0] = [row for row in joining if row not in rows]
                            break
                        new_batch, new_logits = self._prefill(group)
                        if rows:
                            batch, logits = self._merge(batch, new_batch), torch.cat([logits, new_logits])
                        else:
                            batch, logits = new_batch, new_logits
                        rows = rows + group
                    tokens = self._sample(rows, logits)
                    keep = [i for i, row in enumerate(rows) if not self._finished(row)]
                    for i, row in enumerate(rows):
                        if i not in keep:
                            row.done.set()
                    if not keep:
                        rows, batch, logits = [], None, None
                        continue
                    if len(keep) < len(rows):
                        rows, batch = [rows[i] for i in keep], self._select(batch, keep)
                        tokens = tokens[keep]
                    batch, logits = self._step(rows, batch, tokens)
            except Exception as exc:  # noqa: BLE001 - every waiting request gets the error, the loop goes on
                log.exception("generation failed for a batch of %d", len(rows) + len(joining))
                with self._wake:  # rows put back for later are answered with the error too
                    self._pending = [row for row in self._pending if row not in joining]
                for row in {*rows, *joining}:
                    row.error = exc
                    row.done.set()
                rows, batch, logits = [], None, None

    def _prefill_groups(self, rows: list[Row]) -> list[list[Row]]:
        """`rows` in prefill batches of at most `prefill_tokens` padded tokens (a prompt longer than that alone):
        the attention mask of a padded prefill holds rows x length^2 entries, too many for 32 long agent histories."""
        groups: list[list[Row]] = []
        for row in sorted(rows, key=lambda r: len(r.ids)):
            if groups and (len(groups[-1]) + 1) * len(row.ids) <= self.prefill_tokens:
                groups[-1].append(row)
            else:
                groups.append([row])
        return groups

    def _prefill(self, rows: list[Row]) -> tuple[tuple[Any, Any], Any]:
        """Run the prompts of `rows`, left-padded to one length; their KV cache, attention mask and last logits."""
        import torch
        from transformers.cache_utils import DynamicLayer

        width = max(len(row.ids) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row.ids):] = torch.tensor(row.ids)
            mask[i, width - len(row.ids):] = 1
            if row.temperature > 0:  # the row's own random stream: its draws do not depend on the batch
                seed = row.seed if row.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
                row.generator = torch.Generator(device=self.device).manual_seed(seed)
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        cache = out.cache
        if self._can_join is None:  # joining pads and concatenates plain per-layer tensors (no sliding windows)
            self._can_join = all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))
            if not self._can_join:
                log.warning("this model's KV cache (%s) cannot be merged: requests are batched as they arrive, and "
                            "those arriving later wait for the batch to finish", type(cache).__name__)
        return (cache, mask), out.logits[:, -1, :]

    @staticmethod
    def _merge(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
        """One batch of `a`'s rows then `b`'s: the shorter is padded on the left (masked) to the other's length."""
        import torch
        import torch.nn.functional as F

        (cache, mask), (other, other_mask) = a, b
        width = max(mask.shape[1], other_mask.shape[1])

        def pad(t: Any, dim_from_end: int) -> Any:
            missing = width - t.shape[-dim_from_end]
            return t if missing == 0 else F.pad(t, (0, 0) * (dim_from_end - 1) + (missing, 0))

        for layer, new in zip(cache.layers, other.layers, strict=True):
            layer.keys = torch.cat([pad(layer.keys, 2), pad(new.keys, 2)])
            layer.values = torch.cat([pad(layer.values, 2), pad(new.values, 2)])
        return cache, torch.cat([pad(mask, 1), pad(other_mask, 1)])

    @staticmethod
    def _select(batch: tuple[Any, Any], keep: list[int]) -> tuple[Any, Any]:
        """The rows `keep` of a batch, without the leading positions that are padding in all of them."""
        import torch

        cache, mask = batch
        index = torch.tensor(keep, device=mask.device)
        mask = mask[index]
        skip = int((mask.sum(0) > 0).int().argmax())  # the first position some row uses
        for layer in cache.layers:
            layer.keys = layer.keys[index, :, skip:]
            layer.values = layer.values[index, :, skip:]
        return cache, mask[:, skip:]

    def _step(self, rows: list[Row], batch: tuple[Any, Any], tokens: Any) -> tuple[tuple[Any, Any], Any]:
        """Feed each row its last sampled token: the batch one position longer, and the next logits."""
        import torch

        cache, mask = batch
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
        positions = torch.tensor([[len(row.ids) + len(row.new) - 1] for row in rows], device=mask.device)
        out = self.model(input_ids=tokens.unsqueeze(1), attention_mask=mask, position_ids=positions,
                         cache=cache, use_cache=True)
        return (out.cache, mask), out.logits[:, -1, :]

    def _sample(self, rows: list[Row], logits: Any) -> Any:
        """Each row's next token under its own temperature, top-k and top-p (in that order, as transformers' warpers
        apply them) and its own generator; greedy rows take the argmax. Records the token and its log-prob under
        the processed distribution."""
        import torch

        scores = logits.float()
        vocab = scores.shape[-1]
        greedy = [row.temperature <= 0 for row in rows]
        # Greedy rows: temperature 1, no top-k or top-p (their log-probs are the raw model's, as generate's scores)
        temps = torch.tensor([[row.temperature if row.temperature > 0 else 1.0] for row in rows], device=scores.device)
        scores = scores / temps
        top_k = torch.tensor([row.top_k if row.temperature > 0 and 0 < row.top_k < vocab else vocab for row in rows],
                             device=scores.device)
        if bool((top_k < vocab).any()):
            kth = torch.sort(scores, dim=-1, descending=True).values.gather(-1, (top_k - 1).unsqueeze(-1))
            scores = scores.masked_fill(scores < kth, float("-inf"))
        top_p = torch.tensor([[row.top_p if row.temperature > 0 else 1.0] for row in rows], device=scores.device)
        if bool((top_p < 1.0).any()):  # transformers' TopPLogitsWarper, one threshold per row
            ordered, order = torch.sort(scores, descending=False)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= (1 - top_p)
            remove[..., -1:] = False
            scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
        logprobs = torch.log_softmax(scores, dim=-1)
        tokens = scores.argmax(dim=-1)
        for i, row in enumerate(rows):
            if not greedy[i]:
                tokens[i] = torch.multinomial(logprobs[i].exp(), 1, generator=row.generator)[0]
        chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        for row, token, lp in zip(rows, tokens.tolist(), chosen.tolist(), strict=True):
            row.new.append(token)
            row.logprobs.append(lp)
        return tokens

    def _finished(self, row: Row) -> bool:
        if row.new[-1] in self.eos_ids or len(row.new) >= row.limit:
            return True
        if row.stops:
            # Only the reply's tail can hold a stop string that this token completed (an earlier one ended the row at
            # its own step): decoding the whole reply every step would cost quadratic time in its length. A token
            # decodes to at least one byte and a character takes at most four, so this many tokens cover the longest
            # stop string.
            window = 4 * max(len(s) for s in row.stops) + 4
            text = self.decode(row.new[-window:])
            return any(s in text for s in row.stops)
        return False
