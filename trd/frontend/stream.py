"""Output text of one request as its tokens arrive: UTF-8-safe and stop-string aware.

The stream reads the request's own token list (it keeps no copy): `update()` decodes
what was appended since the last call.

Byte-level BPE splits a character across tokens ('ö' may be two tokens, each decoding
to U+FFFD alone), so text is decoded over a window that begins a few tokens back:

    ids:   ... | ids[prefix:read] (decoded before) | ids[read:] (new) |
    new text = decode(ids[prefix:]) minus decode(ids[prefix:read])

and nothing is released while the window ends inside a character.

Stop strings: text is released only up to the start of the longest suffix that could
still grow into a stop string, so no partial stop text ever reaches the client; once a
stop string appears, the text is cut before it (after it with `keep_stop`, vLLM's
include_stop_str_in_output) and the stream ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(
        self,
        tokenizer: Tokenizer,
        ids: Sequence[int],
        stops: Sequence[str] = (),
        keep_stop: bool = False,
    ) -> None:
        self.tok = tokenizer
        self.stops = tuple(stops)
        self.keep_stop = keep_stop
        self.ids = ids  # the request's output ids, appended to by its owner
        self.prefix = 0  # window start: context for decoding the new ids
        self.read = 0  # ids before this are in `text` (= tokens the client has been served)
        self.text = ""
        self.sent = 0  # characters of `text` released
        self.stopped = False  # a stop string matched; `text` ends before it (or after it)

    def update(self) -> str:
        """Decode the ids appended since; return the text that became safe to send."""
        if self.stopped:
            return ""
        return self._advance(final=False)

    def finish(self) -> str:
        """The request ended: decode what is left (even a broken character) and release it."""
        if self.stopped:
            return ""
        out = self._advance(final=True)
        return out if self.stopped else out + self._release(final=True)

    def _advance(self, final: bool) -> str:
        """Decode the new ids and release their text. With stop strings one token at a
        time (a broken character: until it is whole), so that `read` ends at the token
        that completes a stop string however many arrived together (an engine commits
        several in one step when it speculates: trd/engines/speculate.py)."""
        end = len(self.ids)
        step = 1 if self.stops else end - self.read
        upto, out = min(end, self.read + step), []
        while self.read < end and not self.stopped:
            last = final and upto == end
            if self._decode(last, upto):
                out.append(self._release(last))
                upto = min(end, self.read + step)
            elif upto < end:
                upto += 1
            else:
                break
        return "".join(out)

    def _decode(self, final: bool, upto: int) -> bool:
        """Add the text of ids[read:upto]; False (nothing added) while it ends inside a
        character, unless `final`."""
        before = self.tok.decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        window = self.tok.decode(self.ids[self.prefix : upto], skip_special_tokens=True)
        if window.endswith(_REPLACEMENT) and not final:
            return False  # the last character is incomplete; wait for its remaining bytes
        self.text += window[len(before) :]
        self.prefix, self.read = self.read, upto
        return True

    def _release(self, final: bool) -> str:
        cut = self._find_stop()
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
            end = cut
        else:
            end = len(self.text) if final else len(self.text) - self._held()
        out, self.sent = self.text[self.sent : end], max(self.sent, end)
        return out

    def _find_stop(self) -> int | None:
        """Where the text ends at the first stop string, if one has appeared."""
        # A match cannot start before `sent`: its beginning would have been held back.
        found = ((self.text.find(s, self.sent), s) for s in self.stops)
        hits = [(i, -len(s)) for i, s in found if i >= 0]  # the earliest, then the longest
        if not hits:
            return None
        start, minus_len = min(hits)
        return start - minus_len if self.keep_stop else start

    def _held(self) -> int:
        """Length of the longest suffix of the unsent text that begins some stop string."""
        tail = self.text[self.sent :]
        longest = max((len(s) - 1 for s in self.stops), default=0)
        for k in range(min(longest, len(tail)), 0, -1):
            if any(s.startswith(tail[-k:]) for s in self.stops):
                return k
        return 0
