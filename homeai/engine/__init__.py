"""The loop that owns the device: sequences, KV blocks, the step plan, streams to asyncio."""
