"""Fault injection against a three-broker cluster: a workload that records a history, nemeses
on a seeded schedule, and a checker that decides from the whole history whether a guarantee
broke."""
