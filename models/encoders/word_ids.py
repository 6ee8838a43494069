"""A query's token ids without the tokenizer's per-call work: exact for BERT-style WordPiece on printable ASCII.

Why: a static student's whole encode is a gather and a sum (tens of microseconds), so the `tokenizers` call around
it (about 0.1 ms: normalization, offsets, masks, type ids, an Encoding object) became most of the cost. WordPiece
splits word by word, so for the common case (a printable-ASCII query) the ids are the concatenation of each word's
ids: lower-case when the normalizer does, split into runs of letters/digits and single punctuation characters as
BertPreTokenizer does on ASCII, look each word up in a dict filled from the tokenizer's own WordPiece model, add the
special tokens and truncate as the tokenizer would. Anything else (non-ASCII, control characters, a special token's
text, another tokenizer family) goes to the tokenizer itself, so the ids are always the tokenizer's.
"""

from __future__ import annotations

import json
import logging
import re

from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# BertPreTokenizer on printable ASCII: whitespace drops out, every punctuation character is its own word (Rust's
# is_ascii_punctuation covers every printable ASCII character that is neither alphanumeric nor a space)
WORDS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9 ]")
MAX_WORDS = 50_000  # distinct cached words (a few MiB); past it, new words are tokenized each time
PROBES = (
    "", "a", "Hello, World!", "what's the half-life of C-14 (carbon)?", "x" * 150, "un$believ@ble_ness ~ [test]",
    "DNA-repair in BRCA1/BRCA2 carriers: 3.5% vs. 12%", " ".join(["tokens"] * 200), "a <mask> b [MASK] c",
)


class WordIds:
    """Token ids of one text, the same as `tokenizer.encode(text).ids`; thread-safe (a dict under the GIL)."""

    def __init__(self, tokenizer: Tokenizer, lowercase: bool, prefix: list[int], suffix: list[int],
                 budget: int | None) -> None:
        self.tokenizer, self.lowercase = tokenizer, lowercase
        self.prefix, self.suffix, self.budget = prefix, suffix, budget
        self.model = tokenizer.model
        self.added = [t.content.lower() for t in tokenizer.get_added_tokens_decoder().values()]
        self.words: dict[str, list[int]] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> WordIds | None:
        """A WordIds for a BertNormalizer + BertPreTokenizer + WordPiece tokenizer whose ids it reproduces on the
        probes, else None (the caller keeps calling the tokenizer)."""
        config = json.loads(tokenizer.to_str())
        normalizer, pre = config.get("normalizer") or {}, config.get("pre_tokenizer") or {}
        truncation, padding = tokenizer.truncation, tokenizer.padding
        if normalizer.get("type") != "BertNormalizer" or pre.get("type") != "BertPreTokenizer" or \
                config["model"].get("type") != "WordPiece" or (padding and padding.get("length") is not None) or \
                (truncation and (truncation["direction"] != "right" or truncation["stride"])):
            return None
        specials = tokenizer.encode("").ids
        word = [t.id for t in tokenizer.model.tokenize("a")]
        ids = tokenizer.encode("a").ids
        at = next((i for i in range(len(ids)) if ids[i : i + len(word)] == word), None)
        if at is None or ids[:at] + ids[at + len(word):] != specials:
            return None
        budget = truncation["max_length"] - len(specials) if truncation else None
        made = cls(tokenizer, bool(normalizer.get("lowercase")), ids[:at], ids[at + len(word):], budget)
        wrong = [p for p in PROBES if made.ids(p) != tokenizer.encode(p).ids]
        if wrong:
            log.warning("word cache disagrees with the tokenizer on %r: the tokenizer encodes every query", wrong[0])
            return None
        made.words.clear()
        return made

    def ids(self, text: str) -> list[int]:
        """`tokenizer.encode(text).ids`: from the word cache for printable ASCII, from the tokenizer otherwise."""
        if not (text.isascii() and text.isprintable()):
            return self.tokenizer.encode(text).ids
        lowered = text.lower()
        if any(a in lowered for a in self.added):
            return self.tokenizer.encode(text).ids
        words, out = self.words, list(self.prefix)
        for w in WORDS.findall(lowered if self.lowercase else text):
            pieces = words.get(w)
            if pieces is None:
                pieces = [t.id for t in self.model.tokenize(w)]
                if len(words) < MAX_WORDS:
                    words[w] = pieces
            out += pieces
        if self.budget is not None and len(out) - len(self.prefix) > self.budget:
            del out[len(self.prefix) + self.budget :]
        out += self.suffix
        return out
