"""When a periodic piece of the training loop runs: the meaning every ``interval`` option shares."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Every:
    """Due after every ``interval``-th step (1-based updates done) and after the run's last step; never when
    ``interval`` is 0, the value a piece that is off (or has nothing to do) is given."""

    interval: int

    def due(self, step: int, last: bool) -> bool:
        """Whether to run after ``step``; ``last``: it is the run's final step."""
        return self.interval > 0 and (last or step % self.interval == 0)
