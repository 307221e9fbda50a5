"""The coordinator's delay services: ``ScheduleDeliveryService`` (delay levels) and
``TimerService`` (timers) on one engine that holds each record of SCHEDULE and the timer topic
until it is due and delivers it (a timer recalled in time is skipped,
:mod:`~bridge.coordinator.delay.recall_watch`). Runs in the coordinator process only; how a client
routes a delayed message there is :mod:`bridge.delay`."""
