"""One request's generation state: its sampling parameters, the next-token choice, and the text it
has produced so far, cut at a stop string and streamed in pieces that never split a character."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Params:
    """The request's options, checked by model_backend.parse_request."""
    max_tokens: int
    temperature: float = 0.0  # 0: greedy, as tq-run
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False


def choose_token(logits: torch.Tensor, params: Params, generator: torch.Generator | None) -> int:
    """The next token from one row's logits [vocab]: the argmax when greedy, else a draw from the
    temperature-scaled distribution cut to its top_p nucleus."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always)
        keep = torch.cumsum(sorted_probs, 0) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


class TextStream:
    """The generated tokens' text. push() returns the new piece that can be sent and whether a stop
    string ended the text; the text is always the tokenizer's decode of all tokens so far (so it
    equals tq-run's), cut before the first stop string."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.tokens: list[int] = []
        self.sent = 0  # characters already returned
        self.text = ""
        self.stopped = False

    def push(self, token: int) -> str:
        self.tokens.append(token)
        self.text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        for s in self.stop:
            at = self.text.find(s)
            if at >= 0:
                self.text, self.stopped = self.text[:at], True
        if self.stopped:
            return self.flush()
        # hold back a character still incomplete (U+FFFD) and anything a stop string may start
        ready = len(self.text.rstrip("\ufffd"))
        if self.stop:
            ready = min(ready, len(self.text) - max(map(len, self.stop)) + 1)
        if ready <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent:ready], ready
        return piece

    def flush(self) -> str:
        """The rest of the text, at the end of the generation."""
        piece, self.sent = self.text[self.sent:], max(self.sent, len(self.text))
        return piece
