"""Count words in documents."""

import re

_WORD = re.compile(r"[a-z']+")


class WordCounter:
    """Accumulates word frequencies over the texts fed to it."""

    def __init__(self):
        self.counts = {}

    def feed(self, text):
        """Count the words of ``text`` (case-insensitive) and return self."""
        for word in _WORD.findall(text.lower()):
            self.counts[word] = self.counts.get(word, 0) + 1
        return self

    def most_common(self, n=3):
        """Return the ``n`` most frequent (word, count) pairs, ties A-Z."""
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def total(self):
        """Return the number of words counted so far."""
        return sum(self.counts.values())
