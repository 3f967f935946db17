"""Views of a running node, above the node: its status (the per-shard view), health for gRPC
health checking, the Prometheus registry, the status page and the HTTP server that serves them.
The instruments the core writes to live below the node, in ``timeshard.observe``."""
