"""An always-on numerics flight recorder: the last K steps of every module output, gradient and
parameter, dumped and replayed when a NaN, a loss spike or a gradient-norm spike shows (docs/monitor.md)."""

from torchdebug.monitor._config import MonitorConfig
from torchdebug.monitor._monitor import Monitor, MonitorEvent
from torchdebug.monitor._replay import ReplayOutcome
from torchdebug.monitor._triggers import StepSummary
from torchdebug.monitor._watch import ModelCallEnd

__all__ = ["ModelCallEnd", "Monitor", "MonitorConfig", "MonitorEvent", "ReplayOutcome", "StepSummary"]
