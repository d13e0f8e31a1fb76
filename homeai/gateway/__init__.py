"""The gateway above the engines: the policy's models pulled from the repository and loaded within the
memory budget (``model_pool``, ``footprint``), each request routed to a class and a model, and every
submission metered (``metering``). The API and the jobs talk to ``gateway.Gateway``; it drives the
engines (``homeai.engine``) through the one device loop."""
