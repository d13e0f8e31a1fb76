"""HomeAI monitor: a Textual app over the gateway's HTTP API.

It talks to the server only through HTTP (httpx) so that it runs anywhere the API is reachable and
never depends on the server's internals: nothing here imports ``homeai``.
"""
