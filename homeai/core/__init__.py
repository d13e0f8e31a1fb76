"""Plain types below every part: sampling params, sequences, step plans and outputs, the KV block manager."""
