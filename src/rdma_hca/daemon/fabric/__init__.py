"""The fabric room: each RoCE port's LLDP neighbour, and what the daemon publishes of it."""
