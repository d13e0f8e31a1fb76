"""Virtual-time simulation of the scheduler and batcher with a cost-model runner."""
