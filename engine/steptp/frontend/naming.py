"""Fresh names for the PyTorch -> LEIR translator (reference-notes §1.3-1.4).

Tensor names
    An uppercase first letter, then lowercase letters: ``A C D E F G H I J K M N O Q R S W X Y
    Z``, then ``Aa Ab ... Az Ca ...``, then three letters. ``L P V B U T`` never start a name:
    the first five are loop kinds and ``T`` is TVMScript's namespace, so keeping them out keeps
    printed LEIR and lowered TIR readable.

Loop index names
    Lowercase. Serial/reduction axes are ``a c d f g h i j k l m n o p q r s u w`` and then
    two-letter combinations of those letters (``aa ac ad ...``). ``e`` is never used (it would
    read as scientific notation), and no serial name starts with ``t b x y z`` (reserved for
    bound axes: ``tx``, ``bx``, ``tya``...) or ``v`` (TIR's ``v_`` block-iterator prefix).

Both generators are deterministic: the n-th name only depends on n.
"""

from __future__ import annotations

import itertools
import string
from typing import Iterable, Iterator

#: first letters a tensor name may start with (A-Z minus L P V B U T)
TENSOR_INITIALS = "".join(c for c in string.ascii_uppercase if c not in "LPVBUT")
#: letters for serial/reduction loop indices (a-z minus b e t v x y z)
INDEX_LETTERS = "".join(c for c in string.ascii_lowercase if c not in "betvxyz")
#: names of the bound axes the translator emits (threadIdx.x, blockIdx.x)
THREAD_X = "tx"
BLOCK_X = "bx"


def tensor_name(n: int) -> str:
    """The ``n``-th tensor name (0 -> ``A``, 1 -> ``C``, 19 -> ``Z``, 20 -> ``Aa``).

    Raises ``ValueError`` for a negative ``n``."""
    if n < 0:
        raise ValueError("name index must be >= 0")
    k = len(TENSOR_INITIALS)
    if n < k:
        return TENSOR_INITIALS[n]
    n -= k
    length = 1
    while n >= k * 26 ** length:
        n -= k * 26 ** length
        length += 1
    tail = []
    for _ in range(length):
        n, r = divmod(n, 26)
        tail.append(string.ascii_lowercase[r])
    return TENSOR_INITIALS[n] + "".join(reversed(tail))


def index_name(n: int) -> str:
    """The ``n``-th serial loop index name (0 -> ``a``, 1 -> ``c``, 19 -> ``aa``).

    Raises ``ValueError`` for a negative ``n``."""
    if n < 0:
        raise ValueError("name index must be >= 0")
    k = len(INDEX_LETTERS)
    length = 1
    while n >= k ** length:
        n -= k ** length
        length += 1
    out = []
    for _ in range(length):
        n, r = divmod(n, k)
        out.append(INDEX_LETTERS[r])
    return "".join(reversed(out))


class TensorNames:
    """Sequential tensor-name generator that skips names already taken.

    ``fresh()`` returns the next unused name of :func:`tensor_name`'s sequence; ``reserve(name)``
    marks a name as taken (a name outside the sequence is accepted as long as it starts with an
    allowed uppercase letter; anything else raises ``ValueError``).
    """

    def __init__(self, taken: Iterable[str] = ()):
        self._taken: set[str] = set()
        self._next = 0
        for t in taken:
            self.reserve(t)

    def reserve(self, name: str) -> str:
        """Mark ``name`` as taken; ``ValueError`` if it is invalid or already taken."""
        rest = name[1:]
        if not name or name[0] not in TENSOR_INITIALS or (rest and not (rest.isalpha() and rest.islower())):
            raise ValueError(f"{name!r} is not a valid generated tensor name")
        if name in self._taken:
            raise ValueError(f"tensor name {name!r} is already taken")
        self._taken.add(name)
        return name

    def fresh(self) -> str:
        """The next unused name of :func:`tensor_name`'s sequence (marked as taken)."""
        while True:
            name = tensor_name(self._next)
            self._next += 1
            if name not in self._taken:
                self._taken.add(name)
                return name

    @property
    def taken(self) -> frozenset[str]:
        """All names handed out or reserved so far."""
        return frozenset(self._taken)


def index_names() -> Iterator[str]:
    """Infinite iterator over serial index names: ``a c d f ... w aa ac ...``."""
    return (index_name(i) for i in itertools.count())


__all__ = ["TENSOR_INITIALS", "INDEX_LETTERS", "THREAD_X", "BLOCK_X", "tensor_name", "index_name",
           "TensorNames", "index_names"]
