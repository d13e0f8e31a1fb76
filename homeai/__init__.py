"""HomeAI Gateway: workload classes sharing one accelerator through one batcher."""
__version__ = "0.1.0"
