"""Security at the gRPC edge: TLS and mutual TLS (``tls``), development certificates
(``certs``), role tokens and the server interceptor that checks them (``auth``), and the
client side of both (``channel``)."""
