"""What the flight recorder watches, when it triggers and what it does then (:class:`MonitorConfig`).

Thresholds are robust z-scores: how many scaled median absolute deviations a step's value lies
above the median of the steps before it in the window (1.4826 MAD estimates one standard deviation
of normally distributed values). A loss that falls, however fast, never triggers; a spike has to
stand out from the recent steps, so a loss curve's ordinary noise stays below 8.
"""

from __future__ import annotations

from typing import Annotated, Literal

from torchdebug.config import OnWriteError
from torchdebug.options import AtLeast, Folder, Options, configclass, option


@configclass
class MonitorConfig(Options):
    """Options of :class:`~torchdebug.Monitor` (docs/monitor.md)."""

    dump_path: Folder = option(
        "Folder the window dump and the replay are written under when a trigger fires.", default="./monitor"
    )
    window: Annotated[int, AtLeast(2)] = option("Steps kept: the window written when a trigger fires.", default=32)
    loss_spike: Annotated[float, AtLeast(0)] = option(
        "Robust z-score of the loss above the window's median that triggers; 0 turns the trigger off.", default=8.0
    )
    grad_norm_spike: Annotated[float, AtLeast(0)] = option(
        "Robust z-score of the total gradient norm above the window's median that triggers; 0 turns it off.", default=8.0
    )
    loss_spike_floor: Annotated[float, AtLeast(0)] = option(
        "The smallest spread the loss's (and a module output norm's) z-score divides by, as a fraction of the "
        "window's median: after a smooth history a loss spike has to exceed the median by loss_spike * this "
        "fraction of it (80% at the defaults), not by a few of its tiny deviations.",
        default=0.1,
    )
    grad_norm_spike_floor: Annotated[float, AtLeast(0)] = option(
        "The same floor for the gradient norm, which a healthy run moves by multiples (leaving a plateau, a "
        "learning-rate warm-up): a gradient-norm spike has to reach 1 + grad_norm_spike * this times the median "
        "(5 times at the defaults).",
        default=0.5,
    )
    history: Annotated[int, AtLeast(2)] = option(
        "Steps seen before the spike triggers judge (a first step has nothing to stand out from).", default=8
    )
    scaler_overflows: Annotated[int, AtLeast(1)] = option(
        "With a loss scaler (fp16): steps in a row whose gradients overflow, each skipped by the scaler, before that "
        "fires as non-finite (16 halvings take the default scale of 65536 to 1).",
        default=16,
    )
    on_anomaly: Literal["continue", "skip", "raise"] = option(
        "After a trigger in Monitor.step(closure): continue (take the optimizer step), skip it, or raise AnomalyError.",
        default="continue",
    )
    on_write_error: OnWriteError = option(
        "When the window dump or the replay cannot be written (a full disk, a read-only filesystem): continue: the "
        "event is kept with the error in it and training goes on; raise: DumpError out of Monitor.step.",
        default="continue",
    )
    replay: Literal["statistics", "tensor", "off"] = option(
        "Re-run the anomalous step under op-level capture with this task (statistics or tensor), or off.",
        default="statistics",
    )
    max_events: Annotated[int, AtLeast(1)] = option(
        "Triggers of each reason (NaN/Inf, loss spike, gradient-norm spike, predicate) that write a window dump "
        "(and replay); later ones are logged and counted only.",
        default=1,
    )
