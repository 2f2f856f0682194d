"""Talking to the Kubernetes API server: credentials, one client with client-go's manners
(rate limit, Retry-After, backoff with jitter, a deadline on every request), errors that
are one line each. Imported by the daemon and the tools alike; it imports only ``kit``.
"""
