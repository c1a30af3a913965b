"""The only layer that knows Kopf and the process: watches, Lease, webhooks, metrics, probes."""
