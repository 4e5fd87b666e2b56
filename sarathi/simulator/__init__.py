"""The simulator: the engine's own step loop, scheduler and block manager, with iteration times charged
from a latency model on a simulated clock instead of running a model."""
