"""Delay levels and timers as a client sends them, shared with the coordinator: the levels,
timer precisions and their checks (:mod:`~bridge.delay.model`) and the routing of a delayed
message to its partition of SCHEDULE or the timer topic, as the record it will become
(:mod:`~bridge.delay.routing`), and a timer's recall handle with the rule that says whether a
recall marker applies (:mod:`~bridge.delay.recall`). No I/O. The coordinator's services that hold
and deliver these records are :mod:`bridge.coordinator.delay`."""
