"""What the flight recorder watches, when it triggers and what it does then (:class:`MonitorConfig`).

Thresholds are robust z-scores: how many scaled median absolute deviations a step's value lies
above the median of the steps before it in the window (1.4826 MAD estimates one standard deviation
of normally distributed values). A loss that falls, however fast, never triggers; a spike has to
stand out from the recent steps, so a loss curve's ordinary noise stays below 8.
"""

from __future__ import annotations

from dataclasses import field

from torchdebug.config import ON_WRITE_ERROR
from torchdebug.options import Options, configclass, number, one_of, option, text

ACTIONS = ("continue", "skip", "raise")
REPLAYS = ("statistics", "tensor", "off")


@configclass
class MonitorConfig(Options):
    """Options of :class:`~torchdebug.Monitor` (docs/monitor.md)."""

    dump_path: str = field(
        default="./monitor",
        metadata=option(
            "Folder the window dump and the replay are written under when a trigger fires.", text("a folder path"), type="string"
        ),
    )
    window: int = field(
        default=32,
        metadata=option("Steps kept: the window written when a trigger fires.", number(2, integer=True), type="integer"),
    )
    loss_spike: float = field(
        default=8.0,
        metadata=option(
            "Robust z-score of the loss above the window's median that triggers; 0 turns the trigger off.",
            number(0),
            type="number",
        ),
    )
    grad_norm_spike: float = field(
        default=8.0,
        metadata=option(
            "Robust z-score of the total gradient norm above the window's median that triggers; 0 turns it off.",
            number(0),
            type="number",
        ),
    )
    loss_spike_floor: float = field(
        default=0.1,
        metadata=option(
            "The smallest spread the loss's (and a module output norm's) z-score divides by, as a fraction of the "
            "window's median: after a smooth history a loss spike has to exceed the median by loss_spike * this "
            "fraction of it (80% at the defaults), not by a few of its tiny deviations.",
            number(0),
            type="number",
        ),
    )
    grad_norm_spike_floor: float = field(
        default=0.5,
        metadata=option(
            "The same floor for the gradient norm, which a healthy run moves by multiples (leaving a plateau, a "
            "learning-rate warm-up): a gradient-norm spike has to reach 1 + grad_norm_spike * this times the median "
            "(5 times at the defaults).",
            number(0),
            type="number",
        ),
    )
    history: int = field(
        default=8,
        metadata=option(
            "Steps seen before the spike triggers judge (a first step has nothing to stand out from).",
            number(2, integer=True),
            type="integer",
        ),
    )
    scaler_overflows: int = field(
        default=16,
        metadata=option(
            "With a loss scaler (fp16): steps in a row whose gradients overflow, each skipped by the scaler, before that "
            "fires as non-finite (16 halvings take the default scale of 65536 to 1).",
            number(1, integer=True),
            type="integer",
        ),
    )
    on_anomaly: str = field(
        default="continue",
        metadata=option(
            "After a trigger in Monitor.step(closure): continue (take the optimizer step), skip it, or raise AnomalyError.",
            one_of(*ACTIONS),
            enum=list(ACTIONS),
        ),
    )
    on_write_error: str = field(
        default="continue",
        metadata=option(
            "When the window dump or the replay cannot be written (a full disk, a read-only filesystem): continue: the "
            "event is kept with the error in it and training goes on; raise: DumpError out of Monitor.step.",
            one_of(*ON_WRITE_ERROR),
            enum=list(ON_WRITE_ERROR),
        ),
    )
    replay: str = field(
        default="statistics",
        metadata=option(
            "Re-run the anomalous step under op-level capture with this task (statistics or tensor), or off.",
            one_of(*REPLAYS),
            enum=list(REPLAYS),
        ),
    )
    max_events: int = field(
        default=1,
        metadata=option(
            "Triggers of each reason (NaN/Inf, loss spike, gradient-norm spike, predicate) that write a window dump "
            "(and replay); later ones are logged and counted only.",
            number(1, integer=True),
            type="integer",
        ),
    )
