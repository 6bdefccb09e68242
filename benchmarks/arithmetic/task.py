"""Synthetic addition problems with exact verification, for the arithmetic experiment.

The task
--------
A problem is ``a + b`` with two non-negative integers whose digit counts are
drawn independently and uniformly from ``1..max_digits``; within a digit
count the operand is uniform (leading digit non-zero, except that the 1-digit
operands are 0..9). Difficulty varies across prompts with the digit counts and
the number of carries.

The prompt is the text ``"{a}+{b}="``, left-padded with the blank character
``" "`` to the fixed width ``2 * max_digits + 2`` so that every prompt has the
same length and batches need no attention mask (the model reads the blanks
like any other character). The answer is the decimal sum written **least
significant digit first** (``3 + 49 = 52`` is answered ``"25"``), followed by
the end marker ``"."``. Writing the sum in reverse lets each digit depend on
the operands' digits already seen and the carry, the format under which small
transformers learn addition (Lee et al. 2023, "Teaching arithmetic to small
transformers"); the task is still not trivial for a model trained briefly.

Verification is exact: a completion is correct when the characters before the
first end marker equal the reversed decimal sum (no leading zeros, no missing
end marker).

Data
----
:func:`make_split` draws a fixed held-out test set first and then a training
pool of distinct problems that share no ``(a, b)`` pair with the test set, both
from ``numpy.random.default_rng(data_seed)``. :func:`sample_problems` draws
fresh problems for the supervised warm start, again excluding the test pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sera_opt.exceptions import SeraOptError

__all__ = [
    "BLANK",
    "END",
    "VOCAB",
    "AdditionProblems",
    "Tokenizer",
    "make_split",
    "sample_problems",
    "verify",
]

BLANK = " "
END = "."
#: Every character the model reads or writes; a token is its index here.
VOCAB = BLANK + "0123456789+=" + END


class Tokenizer:
    """Character-level tokenizer over :data:`VOCAB`."""

    def __init__(self) -> None:
        self.vocab = VOCAB
        self.index = {ch: i for i, ch in enumerate(VOCAB)}
        self.blank_id = self.index[BLANK]
        self.end_id = self.index[END]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[ch] for ch in text]
        except KeyError as exc:
            raise SeraOptError(
                f"character {exc.args[0]!r} is not in the arithmetic vocabulary {VOCAB!r}."
            ) from None

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)


@dataclass(frozen=True)
class AdditionProblems:
    """A set of addition problems ``a[i] + b[i]`` with at most ``max_digits`` digits per operand."""

    a: np.ndarray
    b: np.ndarray
    max_digits: int

    def __post_init__(self) -> None:
        a = np.asarray(self.a, dtype=np.int64)
        b = np.asarray(self.b, dtype=np.int64)
        if a.shape != b.shape or a.ndim != 1:
            raise SeraOptError("a and b must be one-dimensional arrays of the same length.")
        limit = 10 ** int(self.max_digits)
        if (a < 0).any() or (b < 0).any() or (a >= limit).any() or (b >= limit).any():
            raise SeraOptError(
                f"operands must lie in [0, {limit}) for max_digits={self.max_digits}."
            )
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)

    def __len__(self) -> int:
        return int(self.a.shape[0])

    @property
    def prompt_width(self) -> int:
        """Characters in every prompt: two operands, ``+`` and ``=``."""
        return 2 * self.max_digits + 2

    @property
    def answer_width(self) -> int:
        """Characters the model may write: the longest sum plus the end marker."""
        return self.max_digits + 2

    def prompts(self) -> list[str]:
        width = self.prompt_width
        return [f"{a}+{b}=".rjust(width, BLANK) for a, b in zip(self.a.tolist(), self.b.tolist())]

    def answers(self) -> list[str]:
        """The correct completions (reversed sum and end marker)."""
        return [str(a + b)[::-1] + END for a, b in zip(self.a.tolist(), self.b.tolist())]

    def digits(self) -> np.ndarray:
        """The larger operand's digit count of each problem (a difficulty label)."""
        return np.maximum(_num_digits(self.a), _num_digits(self.b))

    def carries(self) -> np.ndarray:
        """Number of carries in the column addition of each problem."""
        a, b = self.a.copy(), self.b.copy()
        carry = np.zeros_like(a)
        count = np.zeros_like(a)
        for _ in range(self.max_digits):
            s = a % 10 + b % 10 + carry
            carry = (s >= 10).astype(np.int64)
            count += carry
            a //= 10
            b //= 10
        return count

    def subset(self, index) -> AdditionProblems:
        index = np.asarray(index)
        return AdditionProblems(self.a[index], self.b[index], self.max_digits)

    def pairs(self) -> set[tuple[int, int]]:
        return set(zip(self.a.tolist(), self.b.tolist()))


def _num_digits(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    out = np.ones_like(x)
    y = x // 10
    while (y > 0).any():
        out += (y > 0)
        y //= 10
    return out


def _draw_operands(rng: np.random.Generator, size: int, max_digits: int) -> np.ndarray:
    digits = rng.integers(1, max_digits + 1, size=size)
    low = np.where(digits == 1, 0, 10 ** (digits - 1))
    high = 10 ** digits
    return low + (rng.random(size) * (high - low)).astype(np.int64)


def _validate_max_digits(max_digits: int) -> int:
    if int(max_digits) != max_digits or not 1 <= max_digits <= 9:
        raise SeraOptError(f"max_digits must be an integer in 1..9, got {max_digits!r}.")
    return int(max_digits)


def sample_problems(rng: np.random.Generator, size: int, max_digits: int, *,
                    exclude: set[tuple[int, int]] | None = None,
                    distinct: bool = False) -> AdditionProblems:
    """Draw ``size`` problems, skipping pairs in ``exclude`` (and repeats when ``distinct``).

    Draws are made in blocks and filtered in order, so the result is a
    deterministic function of the generator's state.
    """
    max_digits = _validate_max_digits(max_digits)
    if size < 0:
        raise SeraOptError(f"size must be non-negative, got {size}.")
    exclude = set() if exclude is None else exclude
    total_pairs = sum(
        (10 if da == 1 else 9 * 10 ** (da - 1)) for da in range(1, max_digits + 1)
    ) ** 2
    if distinct and size > total_pairs - len(exclude):
        raise SeraOptError(
            f"cannot draw {size} distinct problems with max_digits={max_digits}: only "
            f"{total_pairs - len(exclude)} pairs remain; lower the size or raise max_digits."
        )
    seen: set[tuple[int, int]] = set()
    a_out: list[int] = []
    b_out: list[int] = []
    while len(a_out) < size:
        block = max(64, 2 * (size - len(a_out)))
        a = _draw_operands(rng, block, max_digits)
        b = _draw_operands(rng, block, max_digits)
        for x, y in zip(a.tolist(), b.tolist()):
            pair = (x, y)
            if pair in exclude or (distinct and pair in seen):
                continue
            seen.add(pair)
            a_out.append(x)
            b_out.append(y)
            if len(a_out) == size:
                break
    return AdditionProblems(np.asarray(a_out, np.int64), np.asarray(b_out, np.int64), max_digits)


def make_split(data_seed: int, num_train: int, num_test: int,
               max_digits: int) -> tuple[AdditionProblems, AdditionProblems]:
    """The training pool and the fixed held-out test set, from ``data_seed``.

    The test set is drawn first, so it does not change when ``num_train`` does.
    Both sets hold distinct problems and share none.
    """
    rng = np.random.default_rng([int(data_seed), 7001])
    test = sample_problems(rng, num_test, max_digits, distinct=True)
    train = sample_problems(rng, num_train, max_digits, exclude=test.pairs(), distinct=True)
    return train, test


def verify(completions, problems: AdditionProblems) -> np.ndarray:
    """Exact check of each completion against its problem; returns 0/1 rewards.

    A completion (text) is correct when the characters before the first end
    marker equal the reversed decimal sum and the end marker is present.
    """
    completions = list(completions)
    if len(completions) != len(problems):
        raise SeraOptError(
            f"got {len(completions)} completions for {len(problems)} problems; pass one each."
        )
    out = np.zeros(len(problems), dtype=np.float64)
    for i, (text, a, b) in enumerate(zip(completions, problems.a.tolist(), problems.b.tolist())):
        end = text.find(END)
        if end < 0:
            continue
        out[i] = float(text[:end] == str(a + b)[::-1])
    return out
