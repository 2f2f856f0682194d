"""The fake Kubernetes API server (one for doctor's tests, the DRA driver's and the bench),
its validation, and objects to seed it with."""
