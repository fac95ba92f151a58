"""Cutting streamed text into phrases, so synthesis of the first phrase starts while the rest still arrives.

A phrase ends at sentence punctuation followed by whitespace (so "3.5" and "e.g" are not cut mid-token), at a
comma-like mark once the phrase has `min_chars` characters (short clauses alone sound choppy), at CJK
full stops without whitespace, or at the last space before `max_chars` when no punctuation comes.
"""

from __future__ import annotations

import re
import unicodedata

_BOUNDARY = re.compile(
    r"(?P<sentence>[.!?;:…]+[\"'”’)\]]*(?=\s)|[。！？；]+)"  # sentence ends
    r"|(?P<clause>[,—–]+(?=\s)|[，、]+)"  # clause ends
)


def speakable(text: str) -> bool:
    """Whether `text` has anything to say: a letter, digit, mark or symbol, not only whitespace, punctuation,
    zero-width or control characters (which `str.strip` leaves in place)."""
    return any(unicodedata.category(char)[0] in "LNMS" for char in text)


class PhraseSplitter:
    def __init__(self, min_chars: int = 12, max_chars: int = 200):
        self.min_chars = min_chars
        self.max_chars = max_chars
        self._buffer = ""

    @property
    def pending(self) -> str:
        return self._buffer

    def _next_cut(self) -> int | None:
        for match in _BOUNDARY.finditer(self._buffer):
            if match["sentence"] or len(self._buffer[: match.end()].strip()) >= self.min_chars:
                return match.end()
        if len(self._buffer) > self.max_chars:
            space = self._buffer.rfind(" ", 0, self.max_chars)
            return space if space > 0 else self.max_chars
        return None

    def feed(self, text: str) -> list[str]:
        """Phrases completed by `text`, in order."""
        self._buffer += text
        phrases = []
        while (cut := self._next_cut()) is not None:
            phrase, self._buffer = self._buffer[:cut].strip(), self._buffer[cut:]
            if phrase:
                phrases.append(phrase)
        return phrases

    def flush(self) -> list[str]:
        """Whatever is buffered, as one phrase (TextPiece.flush, or the end of the text)."""
        phrase, self._buffer = self._buffer.strip(), ""
        return [phrase] if phrase else []
