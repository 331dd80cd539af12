"""Training input at any dataset size: the data order, and micro-batches (padded, or packed) from the token cache.

Data order: counting examples from the start of training over every step, micro-batch and rank, global position p
is example `epoch_order(seed, p // n)[p % n]`: each epoch a fresh permutation of the n examples, seeded by (seed,
epoch). A rank takes its slice of each global batch (micro-batch m of rank r at step s starts at position
(s * accum + m) * world * micro_batch + r * micro_batch), so ranks see disjoint examples and the order is a pure
function of (seed, step): a resume, under any strategy, continues exactly. The permutation is computed once per
epoch (numpy, ~10 ms at a million rows) and kept while the epoch lasts, so a micro-batch costs a slice and a gather,
whatever n is; the previous sampler shuffled a list of n indices for every example.

Micro-batches come from a TokenCache (eksflow.llm.steps.common.token_cache), memory-mapped: a worker holds only the rows
it batches. An example's labels are its tokens inside the learned spans (a pair's completion, every assistant turn
of a conversation) and IGNORE_INDEX elsewhere (`truncated`). Padded (the default) gives exactly what
`modeling.collate` gives for `modeling.encode_example`'s output, its labels turned into `modeling.next_token_targets`
(logits only where a token is learned).
Packed (`pack_sequences`) puts the micro-batch's examples end to end in as few rows of at most max_seq_len tokens
as fit, with position ids restarting at each example and attention kept inside it; the micro-batch holds the same
examples and the loss averages over the same learned tokens, while less compute goes to padding when example
lengths vary (rows are padded to the longest row, so examples of one length gain little; see bench/README.md).
From a preference cache (method dpo) a micro-batch of n pairs is 2n padded rows, the n chosen sequences then the
n rejected ones, and `target_rows` says which row each learned position belongs to (a sum of log-probs per row).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from eksflow.llm.steps.common import token_cache
from eksflow.llm.steps.common.data import TRAIN_FILE
from eksflow.llm.steps.common.modeling import IGNORE_INDEX, collate, next_token_targets, truncated
from eksflow.llm.steps.train import Args, TrainSettings
from eksflow.runtime.args import StepInputError

if TYPE_CHECKING:
    import numpy as np
    import torch


@functools.lru_cache(maxsize=2)  # the current epoch and the next: a micro-batch may straddle the boundary
def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The permutation of range(n) that epoch `epoch` visits examples in (read-only; 4 bytes per example)."""
    import numpy as np

    # SeedSequence mixes (seed, epoch) into independent streams; it takes non-negative words only
    order = np.random.default_rng([seed & (2**64 - 1), epoch]).permutation(n)
    order = order.astype(np.uint32 if n < 2**32 else np.int64)
    order.flags.writeable = False
    return order


def first_position(step: int, micro: int, rank: int, settings: TrainSettings, world: int) -> int:
    """Global position of the first example of micro-batch `micro` of `rank` at optimizer step `step`."""
    global_batch = settings.micro_batch_size * world * settings.grad_accum_steps
    return step * global_batch + (micro * world + rank) * settings.micro_batch_size


def batch_indices(step: int, micro: int, rank: int, settings: TrainSettings, world: int, n: int) -> list[int]:
    """Example indices of one micro-batch: a pure function of (seed, step), O(micro_batch_size) per call."""
    first = first_position(step, micro, rank, settings, world)
    indices = []
    for position in range(first, first + settings.micro_batch_size):
        indices.append(int(epoch_order(settings.seed, position // n, n)[position % n]))
    return indices


def pack(examples: list[tuple[list[int], list[int]]], capacity: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Examples end to end in rows of at most `capacity` tokens, padded to the longest row.

    Rows are filled first-fit, longest example first (few rows, little padding; the order of examples within a
    micro-batch does not change its loss). position_ids restart at 0 for every example; transformers derives the
    attention boundaries from those restarts (no token attends across examples), and each example's first label
    is ignored, so no example is trained to predict the first token of the next. The padding after the last
    example is a segment of its own, ignored by the loss; there is no attention_mask (positions carry it all).
    """
    import torch

    rows: list[list[tuple[list[int], list[int]]]] = []
    room: list[int] = []
    for ids, labels in sorted(examples, key=lambda e: -len(e[0])):  # stable: equal lengths keep their order
        fit = next((r for r, free in enumerate(room) if free >= len(ids)), None)
        if fit is None:
            rows.append([])
            room.append(capacity)
            fit = len(rows) - 1
        rows[fit].append((ids, labels))
        room[fit] -= len(ids)
    width = max(capacity - free for free in room)
    input_ids, label_rows, positions = [], [], []
    for row in rows:
        tokens: list[int] = []
        targets: list[int] = []
        where: list[int] = []
        for ids, labels in row:
            tokens += ids
            targets += [IGNORE_INDEX] * min(len(labels), 1) + labels[1:]
            where += range(len(ids))
        pad = width - len(tokens)
        input_ids.append(tokens + [pad_id] * pad)
        label_rows.append(targets + [IGNORE_INDEX] * pad)
        positions.append(where + list(range(pad)))
    return {
        "input_ids": torch.tensor(input_ids),
        "labels": torch.tensor(label_rows),
        "position_ids": torch.tensor(positions),
    }


class MicroBatch(NamedTuple):
    """One micro-batch on its device: the loss is cross_entropy(model(**inputs).logits, targets)."""

    inputs: dict[str, Any]  # the forward arguments, logits_to_keep among them (modeling.next_token_targets)
    targets: Any  # torch.Tensor: the learned next token of each position that logits_to_keep marks
    tokens: int  # real tokens: the examples' own tokens (prompt and completion), padding left out
    target_rows: Any = None  # torch.Tensor: the row of each target (preference pairs: rows 0..n-1 chosen, n.. rejected)


class MicroBatches:
    """Micro-batches of one rank from a token cache: the examples `batch_indices` picks, padded or packed."""

    def __init__(self, cache: token_cache.TokenCache, settings: TrainSettings, pad_id: int) -> None:
        if cache.rows == 0:
            raise ValueError(f"token cache {cache.folder} holds no examples")
        self.cache = cache
        self.settings = settings
        self.pad_id = pad_id

    def get(self, step: int, micro: int, rank: int, world: int, device: Any) -> MicroBatch:
        """Micro-batch `micro` of `rank` at optimizer step `step`, on `device`."""
        settings = self.settings
        indices = batch_indices(step, micro, rank, settings, world, self.cache.rows)
        examples = [truncated(*self.cache.example(i), settings.max_seq_len) for i in indices]
        if self.cache.preference:
            examples += [truncated(*self.cache.rejected(i), settings.max_seq_len) for i in indices]
        real = sum(len(ids) for ids, _ in examples)
        if settings.pack_sequences:
            tensors = pack(examples, settings.max_seq_len, self.pad_id)
        else:
            tensors = collate(examples, self.pad_id)
        keep, targets = next_token_targets(tensors.pop("labels"))
        rows = keep.nonzero(as_tuple=True)[0] if self.cache.preference else None
        inputs: dict[str, Any] = {k: v.to(device) for k, v in tensors.items()}
        inputs["logits_to_keep"] = keep.to(device)
        # training never reads a KV cache, and with one transformers ignores the position-id boundaries of packed
        # rows (it looks for packing only when no cache is passed)
        inputs["use_cache"] = False
        return MicroBatch(inputs, targets.to(device), real, None if rows is None else rows.to(device))


def prepare_cache(args: Args, model_dir: Path) -> tuple[Path, int]:
    """Build (or verify) the token cache of the train split before any worker starts: (its folder, the pad id).

    Raises StepInputError (exit 2, not retried) when the split holds no usable example (method dpo: no usable
    preference pair), or a record of a type the method cannot use.
    """
    from eksflow.llm.steps.common.modeling import load_tokenizer

    train_file = args.dataset_dir / TRAIN_FILE
    cache_dir = args.token_cache_dir or token_cache.default_cache_dir(args.model_cache_dir)
    tokenizer = load_tokenizer(model_dir)
    cache, built = token_cache.ensure(train_file, tokenizer, cache_dir, preference=args.method == "dpo")
    print(
        f"token cache: {'built' if built else 'reused'} {cache.folder} ({cache.rows} examples, "
        f"{cache.meta['tokens']} tokens)",
        file=sys.stderr,
        flush=True,
    )
    if cache.rows == 0:
        expected = "prompt/chosen/rejected (method=dpo)" if args.method == "dpo" else "prompt/completion or messages"
        raise StepInputError(f"{str(train_file)!r} holds no usable examples; expected JSON lines of {expected}")
    return cache.folder, int(tokenizer.pad_token_id)


def open_cache(
    folder: str, train_file: Path, model_dir: Path, preference: bool = False
) -> tuple[token_cache.TokenCache, int | None]:
    """A worker's cache: the folder the driver verified, checked again as it is mapped; (cache, pad id if known).

    Without a folder (a caller that built none), or when the folder fails verification after all (damaged since
    the driver checked it), the worker loads the tokenizer and builds or repairs it itself under the cache's lock.
    """
    if folder:
        try:
            return token_cache.TokenCache.open(Path(folder)), None
        except token_cache.CorruptCacheError as err:
            print(f"token cache: {err}; rebuilding it", file=sys.stderr, flush=True)
    from eksflow.llm.steps.common.modeling import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    cache_dir = Path(folder).parent if folder else train_file.parent / token_cache.SUBDIR
    cache, _ = token_cache.ensure(train_file, tokenizer, cache_dir, preference)
    return cache, int(tokenizer.pad_token_id)
