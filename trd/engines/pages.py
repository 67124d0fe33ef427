"""The KV page allocator: pages handed out in runs, and ownership records. Pure Python.

pages:  [0][1][2][3][4][5][6][7]
owner:   a  a  a  -  -  b  b  -      request a's table = [0, 1, 2]; b's = [5, 6]

A request's next page is the one after its last when that one is free, and a new
run starts in the middle of the largest free gap (at its start when nothing lies
before it, earlier when the run would not fit), leaving the first half for the
request before it to grow into. Most requests then keep their KV in one contiguous
run, which the CPU attention reads as a view instead of gathering it. Any page still
serves any request: when the next one is taken, the request continues in a new run.
"""

from __future__ import annotations

import re

_FREE, _OWNED = 1, 0
_FREE_RUN = re.compile(b"\x01+")


class OutOfPages(RuntimeError):
    """Raised when an allocation asks for more pages than are free."""


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"need num_pages, page_size >= 1; got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._state = bytearray([_FREE]) * num_pages
        self._num_free = num_pages
        self._owner: dict[int, int] = {}  # page -> rid

    @property
    def num_free(self) -> int:
        return self._num_free

    def is_free(self, page: int) -> bool:
        return self._state[page] == _FREE

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def allocate(self, rid: int, count: int, after: int | None = None) -> list[int]:
        """`count` pages for `rid`, continuing the run that ends at page `after` if free."""
        if count > self._num_free:
            raise OutOfPages(f"asked for {count} pages, {self._num_free} free")
        pages: list[int] = []
        page = -1 if after is None else after + 1
        for _ in range(count):
            if not 0 <= page < self.num_pages or self._state[page] != _FREE:
                page = self._new_run(count - len(pages))
            self._state[page] = _OWNED
            self._owner[page] = rid
            pages.append(page)
            page += 1
        self._num_free -= count
        return pages

    def _new_run(self, need: int) -> int:
        """Where a run of `need` pages starts: in the largest free gap, at its start when
        nothing lies before it, else in its middle or as late as leaves `need` pages."""
        best = max(_FREE_RUN.finditer(self._state), key=lambda m: m.end() - m.start())
        start, end = best.span()
        return start if start == 0 else max(start, min(start + (end - start) // 2, end - need))

    def free(self, rid: int, pages: list[int]) -> None:
        for page in pages:
            owner = self._owner.pop(page, None)
            if owner != rid:
                raise AssertionError(f"page {page} freed by {rid} but owned by {owner}")
            self._state[page] = _FREE
        self._num_free += len(pages)

    def free_pages(self) -> list[int]:
        return [p for p in range(self.num_pages) if self._state[p] == _FREE]

    def check_integrity(self, tables: dict[int, list[int]]) -> None:
        """Every page is free xor owned by exactly the request whose table lists it."""
        listed = [p for pages in tables.values() for p in pages]
        if len(listed) != len(set(listed)):
            raise AssertionError("a page appears in two page tables")
        owned = {p: rid for rid, pages in tables.items() for p in pages}
        if owned != self._owner:
            raise AssertionError("page tables disagree with the allocator's ownership records")
        free = set(self.free_pages())
        if free & set(owned) or len(free) != self._num_free:
            raise AssertionError("a page is both free and owned, or the free count is off")
        if len(free) + len(owned) != self.num_pages:
            raise AssertionError("pages leaked: free + owned != total")
