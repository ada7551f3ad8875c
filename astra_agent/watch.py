"""The one watch on an endpoint that long runs keep (the eval runner's entries, the synthesis
stages' units): failures to reach it counted in a row, so that a run stops once it is gone
instead of recording every remaining item as a failure. What a failed item becomes is each
run's own (an eval holds its record back until the endpoint answers again; a synthesis unit
stays undone)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EndpointWatch:
    """``limit`` failures in a row mean the endpoint is gone; an answer starts the count
    again."""

    limit: int
    in_a_row: int = 0

    def answered(self) -> None:
        self.in_a_row = 0

    def failed(self) -> bool:
        """Count one failure; True once ``limit`` came in a row (the run should stop)."""
        self.in_a_row += 1
        return self.in_a_row >= self.limit
