"""The operator's views of the coordinator's topics, shared by the ``bridge`` commands and the
console: the undecided and parked transactions (and resolving a parked one), the delay
services' backlog. Run by operator tools only, never by a client or the coordinator."""
