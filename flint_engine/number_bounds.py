"""JSON Schema's numeric bounds (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`) on a number that is
being written: whether its digits so far can still become a number within them, and whether it may end here.

A bounded number is written without an exponent (a JSON number all the same), so the values a prefix can still
become are intervals: `12` becomes 12, then [120, 130), [1200, 1300), ... with more digits; `12.3` becomes a value
in [12.3, 12.4). Exact arithmetic (fractions), no floating-point rounding at the bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

# Digits an integer part may still gain that are looked at (a bound past 10^40 times the digits so far is as good as
# none).
MAX_MORE_DIGITS = 40


@dataclass(frozen=True)
class NumberBounds:
    low: Fraction | None = None
    high: Fraction | None = None
    low_open: bool = False  # exclusiveMinimum
    high_open: bool = False  # exclusiveMaximum

    def holds(self, text: str) -> bool:
        """Whether the whole number `text` is within the bounds."""
        return self._meets(Fraction(text), Fraction(text), False, False)

    def may_become(self, text: str, integer: bool) -> bool:
        """Whether the number begun as `text` (a prefix of a JSON number without exponent) can still end within the
        bounds; `integer`: no fraction may follow."""
        negative = text.startswith("-")
        body = text[1:] if negative else text
        whole, dot, fraction = body.partition(".")
        spans: list[tuple[Fraction, Fraction | None, bool]] = []  # magnitudes [a, b) (b None: unbounded; flag: b in)
        if not whole:
            spans.append((Fraction(0), None, False))
        elif dot:
            start = Fraction(int(whole)) + (Fraction(int(fraction), 10 ** len(fraction)) if fraction else 0)
            spans.append((start, start + Fraction(1, 10 ** len(fraction)), False))
        elif whole == "0":
            spans.append((Fraction(0), Fraction(0) if integer else Fraction(1), integer))
        else:
            digits = int(whole)
            for more in range(MAX_MORE_DIGITS + 1):
                a, b = Fraction(digits * 10**more), Fraction((digits + 1) * 10**more)
                spans.append((a, b - 1, True) if integer else (a, b, False))
        for a, b, b_in in spans:
            if negative:  # values (-b, -a]
                if self._meets(-b if b is not None else None, -a, not b_in, False):  # type: ignore[arg-type]
                    return True
            elif self._meets(a, b, False, not b_in):
                return True
        return False

    def _meets(self, a: Fraction | None, b: Fraction | None, a_open: bool, b_open: bool) -> bool:
        """Whether the interval from a to b (None: unbounded; open ends as flagged) meets the bounds."""
        # The interval's low end against the bounds' high end, and its high end against their low end.
        if (
            self.high is not None
            and a is not None
            and (a > self.high or (a == self.high and (a_open or self.high_open)))
        ):
            return False
        return not (
            self.low is not None and b is not None and (b < self.low or (b == self.low and (b_open or self.low_open)))
        )
