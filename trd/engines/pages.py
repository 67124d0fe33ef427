"""The KV page allocator: a free list and ownership records. Pure Python, no torch.

pages:  [0][1][2][3][4][5][6][7]
owner:   a  a  -  b  -  a  b  -      request a's table = [0, 1, 5]
free:   [2, 4, 7]                    (stack: the most recently freed page is reused first)
"""

from __future__ import annotations


class OutOfPages(RuntimeError):
    """Raised when an allocation asks for more pages than are free."""


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"need num_pages, page_size >= 1; got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free = list(range(num_pages - 1, -1, -1))
        self._owner: dict[int, int] = {}  # page -> rid

    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def allocate(self, rid: int, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfPages(f"asked for {count} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(count)]
        for page in pages:
            self._owner[page] = rid
        return pages

    def free(self, rid: int, pages: list[int]) -> None:
        for page in pages:
            owner = self._owner.pop(page, None)
            if owner != rid:
                raise AssertionError(f"page {page} freed by {rid} but owned by {owner}")
            self._free.append(page)

    def check_integrity(self, tables: dict[int, list[int]]) -> None:
        """Every page is free xor owned by exactly the request whose table lists it."""
        listed = [p for pages in tables.values() for p in pages]
        if len(listed) != len(set(listed)):
            raise AssertionError("a page appears in two page tables")
        owned = {p: rid for rid, pages in tables.items() for p in pages}
        if owned != self._owner:
            raise AssertionError("page tables disagree with the allocator's ownership records")
        if set(self._free) & set(owned) or len(self._free) != len(set(self._free)):
            raise AssertionError("free list overlaps owned pages or repeats a page")
        if len(self._free) + len(owned) != self.num_pages:
            raise AssertionError("pages leaked: free + owned != total")
