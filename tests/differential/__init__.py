"""Differential suite: the same workloads against Apache RocketMQ and against the bridge."""
